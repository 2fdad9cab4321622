"""What an engine returns and a rollout hands to the loss: token ids, masks and per-row temperatures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch


class Rollout(NamedTuple):
    input_ids: torch.Tensor  # [N, P + T] prompt (left-padded to P) then completion (right-padded)
    attention_mask: torch.Tensor  # [N, P + T] 1 on real prompt and completion tokens
    completion_mask: torch.Tensor  # [N, T] 1 on generated tokens up to and including EOS
    temperatures: torch.Tensor  # [N] the temperature each row was sampled at
    prompt_len: int  # P
    texts: list[str]  # N decoded completions (special tokens removed)
    truncated: torch.Tensor  # [N] bool, no EOS within max_new_tokens
    # [N, T] the sampler's log-prob of each sampled token (at the row's temperature, before top-p);
    # None when the engine reports none. The trainer's own log-probs should match it (rollout/logprob_gap)
    sample_logprobs: torch.Tensor | None = None
    # [N, T] bool completion tokens the rollout wrote, not the policy (a reference prefix,
    # rollout/reference_prefix.py): later tokens are scored after them, they carry no loss. None: none
    given: torch.Tensor | None = None
    # multi-turn rollouts (engines/turns.py); None without tools
    tool_calls: torch.Tensor | None = None  # [N] tool calls the row made
    tool_failures: torch.Tensor | None = None  # [N] of them, calls that raised, timed out or were refused
    segments: list[list[tuple[str, str]]] | None = None  # per row, (role, text): policy | tool | environment
    env_rewards: torch.Tensor | None = None  # [N] an environment's reward per row (NaN: none); None: no environment

    @property
    def written(self) -> torch.Tensor:
        """[N, T] the completion tokens the policy wrote (the completion without `given`)."""
        return self.completion_mask if self.given is None else self.completion_mask.masked_fill(self.given, 0)


def rollout_from_ids(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                     logprobs: Sequence[Sequence[float]] | None, temperatures: torch.Tensor, texts: list[str],
                     finished: Sequence[bool], pad_id: int, device: torch.device | str = "cpu") -> Rollout:
    """A Rollout from per-row token id lists: prompts left-padded to the longest, completions
    right-padded; a completion counts up to and including its EOS."""
    n, P = len(prompts), max(len(p) for p in prompts)
    T = max(1, max(len(c) for c in completions))
    ids = torch.full((n, P + T), pad_id, dtype=torch.long)
    attn = torch.zeros(n, P + T, dtype=torch.long)
    lp = torch.zeros(n, T)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attn[i, P - len(p) : P] = 1
        if c:
            ids[i, P : P + len(c)] = torch.tensor(c, dtype=torch.long)
            attn[i, P : P + len(c)] = 1
            if logprobs is not None:
                lp[i, : len(c)] = torch.tensor(logprobs[i], dtype=torch.float32)
    return Rollout(input_ids=ids.to(device), attention_mask=attn.to(device), completion_mask=attn[:, P:].to(device),
                   temperatures=temperatures.to(device), prompt_len=P, texts=texts,
                   truncated=~torch.tensor(list(finished), dtype=torch.bool, device=device),
                   sample_logprobs=None if logprobs is None else lp.to(device))
