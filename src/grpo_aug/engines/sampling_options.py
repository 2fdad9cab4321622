"""Sampling options beyond temperature and top-p (`rollout.top_k|min_p|repetition_penalty|stop`),
the same in both engines (the hf decode loop; vLLM's SamplingParams).

The order follows vLLM's sampler: repetition penalty on the logits, then the row's temperature,
then min-p, top-k and top-p, each on what the previous one kept. A stop string ends its row like
EOS: the tokens that wrote it are the row's last (they carry loss, as EOS does), and the text the
rewards read is cut at the first stop string, the stop string kept or not (`include_stop`).
The log-probs the rollout reports stay the tempered policy's, which the trainer scores: the options
shape which tokens are drawn, as `generate`'s do in TRL, not the objective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grpo_aug.errors import UsageError


@dataclass(frozen=True)
class SamplingOptions:
    top_k: int = 0  # keep the k most likely tokens; 0: off
    min_p: float = 0.0  # drop tokens below min_p x the most likely token's probability; 0: off
    repetition_penalty: float = 1.0  # > 1: tokens of the prompt or completion so far are less likely; 1: off
    stop: tuple[str, ...] = ()  # strings that end a completion
    include_stop: bool = False  # keep the stop string in the completion's text

    def __post_init__(self) -> None:
        checks = [
            (self.top_k >= 0, f"rollout.top_k must be >= 0 (0: off), got {self.top_k}"),
            (0.0 <= self.min_p < 1.0, f"rollout.min_p must be in [0, 1), got {self.min_p}"),
            (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0,
             f"rollout.repetition_penalty must be > 0 (1: off), got {self.repetition_penalty}"),
            (all(isinstance(s, str) and s for s in self.stop),
             f"rollout.stop must be a list of non-empty strings, got {list(self.stop)!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def stop_window(self) -> int:
        """Tokens to decode to find a stop string that the newest token completed (a token is at
        least one character; +2 for tokens that carry part of a character)."""
        return max((len(s) for s in self.stop), default=0) + 2


def penalise_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits [N, V], seen [N, V] bool (tokens of the prompt or completion so far): a seen token's
    positive logit is divided by the penalty, a negative one multiplied (HF's and vLLM's rule)."""
    if penalty == 1.0:
        return logits
    return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)


def filter_probs(probs: torch.Tensor, top_k: int, min_p: float) -> torch.Tensor:
    """probs [N, V] -> probs with min-p's and then top-k's dropped tokens at 0, renormalised."""
    if min_p > 0.0:
        probs = probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
    if top_k > 0:
        kth = probs.topk(min(top_k, probs.shape[-1]), dim=-1).values[:, -1:]  # [N, 1]
        probs = probs.masked_fill(probs < kth, 0.0)  # ties with the k-th token stay
    return probs / probs.sum(dim=-1, keepdim=True)


def cut_at_stop(text: str, stop: tuple[str, ...], include: bool) -> tuple[str, bool]:
    """The text up to its first stop string (included or not), and whether one was found."""
    hits = [(i, s) for s in stop if (i := text.find(s)) >= 0]
    if not hits:
        return text, False
    i, s = min(hits)
    return text[: i + len(s)] if include else text[:i], True
