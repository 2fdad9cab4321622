"""Zero-std group filter and dynamic refill (DAPO's dynamic sampling), as settings + pure parts.

A group whose counted rows all got the same reward has advantage 0 everywhere: it costs a
forward and backward pass and teaches nothing. With `zero_std` such groups are left out of the
update; with `refill` the step rolls out more prompts of the batch's buckets, at most `max_rounds`
extra rounds, until it has `data.batch_size` informative groups, then trains on what it has.
Only rows sampled in this step by the current policy are ever used (on-policy).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_aug.algo.group_stats import group_stats
from grpo_aug.errors import UsageError


@dataclass(frozen=True)
class GroupFilter:
    zero_std: bool = True
    refill: bool = False
    max_rounds: int = 3

    def __post_init__(self) -> None:
        if self.refill and not self.zero_std:
            raise UsageError("rollout.filter.refill needs rollout.filter.zero_std: true (nothing is filtered out)")
        if self.max_rounds < 0:
            raise UsageError(f"rollout.filter.max_rounds must be >= 0, got {self.max_rounds}")


def informative_groups(rewards: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B, G] rewards and counted rows -> [B] bool: at least two counted rows that differ."""
    return group_stats(rewards, valid).informative
