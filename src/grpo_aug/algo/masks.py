"""Which completion tokens carry loss.

Every mask is [N, T] over the completion part of a rollout, 1 = the token is learned from.
Padding is already 0 in the rollout's completion mask; the functions here remove more.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


def truncation_mask(completion_mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Zero the rows that hit max_new_tokens without EOS: their end was never judged."""
    return completion_mask * (~truncated).to(completion_mask.dtype)[:, None]  # [N, T]


def template_mask(pieces: Sequence[str], patterns: Sequence[re.Pattern]) -> list[int]:
    """1 per token, 0 for tokens overlapping any regex match in the joined completion text.

    pieces: each completion token decoded alone, so character offsets line up with tokens;
    scaffolding such as a fixed preamble or `<think>` tags is text the model must copy, not
    reasoning to reinforce.
    """
    text = "".join(pieces)
    covered = bytearray(len(text) + 1)
    for pattern in patterns:
        for m in pattern.finditer(text):
            covered[m.start() : m.end()] = b"\x01" * (m.end() - m.start())
    keep, pos = [], 0
    for piece in pieces:
        end = pos + len(piece)
        keep.append(0 if any(covered[pos:end]) else 1)
        pos = end
    return keep


def repetition_mask(ids: Sequence[int], ngram: int, max_repeats: int) -> list[int]:
    """1 per token, 0 for tokens inside a token n-gram that occurs more than max_repeats times.

    A loop like "1+1=2 1+1=2 1+1=2 ..." would otherwise be reinforced token by token.
    """
    keep = [1] * len(ids)
    if ngram < 1 or len(ids) < ngram:
        return keep
    grams = [tuple(ids[i : i + ngram]) for i in range(len(ids) - ngram + 1)]
    counts = Counter(grams)
    for i, gram in enumerate(grams):
        if counts[gram] > max_repeats:
            keep[i : i + ngram] = [0] * ngram
    return keep


LOOP_NGRAM, LOOP_REPEATS = 4, 3  # a token 4-gram more than 3 times: the row loops (health/looping_frac)


def loops(ids: Sequence[int], ngram: int = LOOP_NGRAM, max_repeats: int = LOOP_REPEATS) -> bool:
    """Whether some token n-gram occurs more than max_repeats times in ids (a degenerate loop)."""
    grams = Counter(tuple(ids[i : i + ngram]) for i in range(len(ids) - ngram + 1))
    return bool(grams) and max(grams.values()) > max_repeats


@dataclass(frozen=True)
class LossMask:
    """Which completion tokens carry loss (built from `algo` by AlgoSettings.loss_mask).

    The template and repetition masks look at each row's tokens (`piece(id)` is a token's text
    alone) and run per row; truncation and row validity are whole-tensor operations.
    """

    mask_truncated: bool = False
    template_patterns: Sequence[re.Pattern] = ()
    repeat_ngram: int = 0
    repeat_max: int = 3

    def __call__(self, completion_ids: torch.Tensor, completion_mask: torch.Tensor, truncated: torch.Tensor,
                 valid: torch.Tensor, piece: Callable[[int], str] | None = None,
                 given: torch.Tensor | None = None) -> torch.Tensor:
        """[N, T] float mask. completion_ids, completion_mask: [N, T] (padding already 0);
        truncated: [N]; valid: [N] rows that count (near-copies, unscorable, filtered and left-out
        rows carry no loss); given: [N, T] tokens the rollout wrote for the policy (a reference
        prefix), never learned from."""
        mask = completion_mask.float()  # [N, T]
        if given is not None:
            mask = mask * (~given).to(mask.dtype)
        if self.mask_truncated:
            mask = truncation_mask(mask, truncated)
        if self.template_patterns or self.repeat_ngram:
            for i, ids in enumerate(completion_ids.tolist()):
                n = int(completion_mask[i].sum())
                keep = torch.ones(n, dtype=mask.dtype)
                if self.template_patterns:
                    pieces = [piece(t) for t in ids[:n]]
                    keep *= torch.tensor(template_mask(pieces, self.template_patterns), dtype=mask.dtype)
                if self.repeat_ngram:
                    keep *= torch.tensor(repetition_mask(ids[:n], self.repeat_ngram, self.repeat_max), dtype=mask.dtype)
                mask[i, :n] *= keep.to(mask.device)
        return mask * valid.reshape(-1, 1).to(mask.dtype)  # [N, T]


class TokenText:
    """token id -> its text alone (special tokens empty), decoded once per id: the template masks'
    view of a completion's tokens."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        if token_id not in self.cache:
            self.cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=True)
        return self.cache[token_id]
