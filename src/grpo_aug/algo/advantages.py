"""Group-relative advantages: each completion is judged only against its own group.

How the centred rewards are scaled is a variant (`algo/scale_rewards=group|batch|none`, TRL's
`scale_rewards`): by the group's own std (GRPO), by one std over the whole batch (TRL's `batch`,
as in LitePPO: a group with a small spread is not blown up to the same size as a contested one),
or not at all (Dr. GRPO).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from grpo_aug.algo.group_stats import GroupStats, group_stats
from grpo_aug.errors import UsageError


class GroupScale:
    """A_i = (r_i - mean_group) / (std_group + eps)."""

    name = "group"
    needs_batch_std = False

    def divisor(self, stats: GroupStats, batch_std: torch.Tensor | None) -> torch.Tensor:
        return stats.std[:, None]  # [B, 1]


class BatchScale:
    """A_i = (r_i - mean_group) / (std_batch + eps): the std of every counted reward of the step,
    on every rank, flat groups included (TRL's `scale_rewards="batch"`)."""

    name = "batch"
    needs_batch_std = True

    def divisor(self, stats: GroupStats, batch_std: torch.Tensor | None) -> torch.Tensor:
        if batch_std is None:
            raise UsageError("algo/scale_rewards=batch needs the step's batch std (batch_reward_std)")
        return batch_std.to(torch.float64)


class NoScale:
    """A_i = r_i - mean_group (Dr. GRPO): nearly-solved prompts do not get a contested one's push."""

    name = "none"
    needs_batch_std = False

    def divisor(self, stats: GroupStats, batch_std: torch.Tensor | None) -> None:
        return None


def batch_reward_std(rewards: torch.Tensor, counted: torch.Tensor,
                     reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Unbiased std (float64 scalar) of the counted rewards (any shape), pooled over ranks:
    `reduce_sum` adds a float64 vector over ranks (None: this process alone). 0 below two rewards."""
    r = rewards.detach().to(torch.float64)
    counted = counted.to(torch.bool)
    # count, sum and sum of squares are what adds up over ranks; the pooled variance follows
    moments = torch.stack([counted.sum().to(torch.float64), r[counted].sum(), (r[counted] ** 2).sum()])  # [3]
    if reduce_sum is not None:
        moments = reduce_sum(moments)
    n, s1, s2 = moments.unbind()
    if n < 2:
        return torch.zeros((), dtype=torch.float64, device=r.device)
    return ((s2 - s1 * s1 / n) / (n - 1)).clamp(min=0.0).sqrt()


def group_advantages(
    rewards: torch.Tensor,
    valid: torch.Tensor | None = None,
    adv_clip: float = 10.0,
    eps: float = 1e-6,
    scale: GroupScale | BatchScale | NoScale | None = None,
    batch_std: torch.Tensor | None = None,
) -> torch.Tensor:
    """A_i = (r_i - mean(r_group)) / (scale + eps), clipped to [-adv_clip, adv_clip].

    rewards: [B, G]; valid: [B, G] bool, rows that take part in their group's statistics
    (invalid rows get advantage 0). The group std is the unbiased sample std over the valid rows
    (GRPO's usual form). A group without two valid rows that differ gets advantage exactly 0
    everywhere, whatever the scale: with one row there is no std, and with equal rewards there is
    no signal, however the float arithmetic rounds (the statistics come from `group_stats`, in
    float64). scale: GroupScale (default), BatchScale (with `batch_std`) or NoScale.
    """
    if valid is None:
        valid = torch.ones_like(rewards, dtype=torch.bool)
    stats = group_stats(rewards, valid)
    divisor = (scale or GroupScale()).divisor(stats, batch_std)
    adv = stats.centered if divisor is None else stats.centered / (divisor + eps)  # [B, G] float64
    return adv.clamp(-adv_clip, adv_clip).to(rewards.dtype)  # [B, G]; 0 outside informative groups
