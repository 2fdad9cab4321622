"""Clip a step's rewards to its own lower/upper quantiles before group normalisation.

One outlier reward (a similarity of 0.99 among 0.1s, a huge length bonus) would otherwise
dominate its group's std and shrink every other advantage. Off by default (`algo/winsorize=none`):
with binary rewards a rare correct answer sits above the 0.99 quantile and would be clipped to 0.
"""

from __future__ import annotations

import torch

from grpo_aug.errors import UsageError


class NoWinsorize:
    def __call__(self, rewards: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        return rewards


class Winsorize:
    """`algo/winsorize=quantile`."""

    def __init__(self, lower: float = 0.01, upper: float = 0.99) -> None:
        if not 0.0 <= lower < upper <= 1.0:
            raise UsageError(
                f"algo.winsorize needs 0 <= lower < upper <= 1, got lower={lower}, upper={upper}"
            )
        self.lower = float(lower)
        self.upper = float(upper)

    def __call__(self, rewards: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """rewards, valid: [B, G]; quantiles (linear interpolation) over the valid entries."""
        if int(valid.sum()) < 2:
            return rewards
        pool = rewards[valid].float()  # [n]
        q = torch.quantile(pool, torch.tensor([self.lower, self.upper], dtype=pool.dtype, device=pool.device))
        return rewards.clamp(q[0].to(rewards.dtype), q[1].to(rewards.dtype))  # [B, G]
