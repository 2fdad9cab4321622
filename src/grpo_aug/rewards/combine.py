"""Weighted sum of reward functions over a [B, G] grid of completions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
import torch

from grpo_aug.data.records import Prompt


class RewardFunction:
    """One entry of `reward.functions`: a callable (prompt, completion) -> float, and its weight."""

    def __init__(self, fn: Callable[[Prompt, str], float], weight: float = 1.0) -> None:
        self.fn = fn
        self.weight = float(weight)

    @property
    def name(self) -> str:
        return getattr(self.fn, "name", type(self.fn).__name__)


def score_completions(
    functions: Sequence[RewardFunction], prompts: Sequence[Prompt], completions: Sequence[Sequence[str]]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total reward [B, G] and each function's raw scores [B, G] (for logging).

    A function that raises stops the step with an error naming the function and the prompt:
    a crash must never be turned into a score.
    """
    parts: dict[str, torch.Tensor] = {}
    total = torch.zeros(len(prompts), len(completions[0]))  # [B, G]
    for rf in functions:
        scores = torch.zeros_like(total)
        for b, (prompt, row) in enumerate(zip(prompts, completions)):
            for g, text in enumerate(row):
                try:
                    value = rf.fn(prompt, text)
                except Exception as err:
                    raise RuntimeError(
                        f"reward function {rf.name!r} raised on prompt {prompt.id!r}: {err!r}"
                    ) from err
                if not isinstance(value, (int, float)):
                    raise TypeError(f"reward function {rf.name!r} returned {value!r}, expected a float")
                scores[b, g] = float(value)
        parts[rf.name] = scores
        total += rf.weight * scores
    return total, parts
