"""The within-group reward statistics, computed in one place for every user.

The advantages, the zero-std filter, the health metrics, the alerts, the temperature controller
and preflight all read these numbers, over the same rows: the rows that count in their group
(scored, kept by every reward filter, not a near-copy, group kept by dedup). An unscorable row is
never a reward of 0 here.

Exactness for flat groups: a group whose counted rewards are all equal must get advantage 0.
In float32, sixteen rewards of 0.3 have a mean one ulp away from 0.3 and a std of ~1e-7, and
(r - mean) / (std + eps) then pushes the whole group one way. So every group is shifted by its
own smallest counted reward first (x - x is exactly 0), statistics run in float64, and a group
without two differing counted rewards is marked flat and gets exactly 0.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class GroupStats(NamedTuple):
    count: torch.Tensor  # [B] counted rows
    mean: torch.Tensor  # [B] float64 mean of the counted rewards; 0 where none counts
    std: torch.Tensor  # [B] float64 unbiased std of the counted rewards; 0 unless informative
    informative: torch.Tensor  # [B] bool: at least two counted rows whose rewards differ
    centered: torch.Tensor  # [B, G] float64 r - mean on counted rows, exactly 0 elsewhere and in flat groups

    @property
    def has_std(self) -> torch.Tensor:
        """[B] bool: groups with a defined std (>= 2 counted rows); the zero-std share is over these."""
        return self.count >= 2


def group_stats(rewards: torch.Tensor, counted: torch.Tensor) -> GroupStats:
    """rewards: [B, G]; counted: [B, G] bool, the rows that take part in their group's statistics."""
    r = rewards.detach().to(torch.float64)  # [B, G]
    counted = counted.to(torch.bool)
    big = torch.finfo(torch.float64).max
    low = torch.where(counted, r, big).min(dim=1, keepdim=True).values  # [B, 1]
    high = torch.where(counted, r, -big).max(dim=1, keepdim=True).values  # [B, 1]
    count = counted.sum(dim=1)  # [B]
    informative = (count >= 2) & (high > low).squeeze(1)  # [B]
    n = count.to(torch.float64).clamp(min=1.0)[:, None]  # [B, 1]
    shifted = torch.where(counted, r - torch.where(count[:, None] > 0, low, 0.0), 0.0)  # [B, G] exact 0 for equals
    shifted_mean = shifted.sum(dim=1, keepdim=True) / n  # [B, 1]
    centered = torch.where(counted & informative[:, None], shifted - shifted_mean, 0.0)  # [B, G]
    var = (centered**2).sum(dim=1) / (n.squeeze(1) - 1.0).clamp(min=1.0)  # [B]
    mean = torch.where(count > 0, (low + shifted_mean).squeeze(1), 0.0)  # [B]
    return GroupStats(count, mean, var.sqrt(), informative, centered)


def mean_std(stats: GroupStats) -> torch.Tensor:
    """Mean within-group std over the groups that have one; 0 when none has (no group carries signal)."""
    has = stats.has_std
    return stats.std[has].mean() if bool(has.any()) else torch.zeros((), dtype=torch.float64, device=has.device)


def counted_mean(rewards: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
    """Mean reward over the counted entries (any shape); 0 when nothing counts."""
    n = counted.sum()
    return torch.where(counted, rewards.to(torch.float64), 0.0).sum() / n.clamp(min=1)


def informative_share(rewards: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
    """Share of the groups with a defined std whose counted rewards differ; 0 when none has a std."""
    stats = group_stats(rewards, counted)
    has = stats.has_std
    return stats.informative[has].to(torch.float64).mean() if bool(has.any()) else torch.zeros(
        (), dtype=torch.float64, device=has.device)


def length_quantiles(lengths: torch.Tensor) -> tuple[float, float, float]:
    """p10, p50, p90 of completion lengths (linear interpolation)."""
    q = torch.quantile(lengths.float(), torch.tensor([0.1, 0.5, 0.9], device=lengths.device)).tolist()
    return q[0], q[1], q[2]


def polarisation(p10: float, p90: float) -> float:
    """p90 / p10 of lengths: >> 1 means some completions stop at once while others run long."""
    return p90 / max(p10, 1.0)
