"""DAPO's soft overlong punishment: a reward term that grows as a completion nears the token limit
(`reward.overlong_buffer`, `reward.overlong_penalty`). It is reward shaping, so it lives with the
rewards; the rollout adds it to each row's total, where the completion lengths are known."""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, penalty: float = 1.0) -> torch.Tensor:
    """[N] values in [-penalty, 0], added to the reward: 0 up to max_len - buffer tokens, then
    falling linearly to -penalty at max_len."""
    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    start = max_len - buffer
    over = (lengths.float() - start).clamp(min=0.0)  # [N]
    return -penalty * (over / buffer).clamp(max=1.0)
