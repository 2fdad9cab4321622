"""Group-relative advantages: each completion is judged only against its own group."""

from __future__ import annotations

import torch

from grpo_aug.algo.group_stats import group_stats


def group_advantages(
    rewards: torch.Tensor,
    valid: torch.Tensor | None = None,
    adv_clip: float = 10.0,
    eps: float = 1e-6,
    scale_by_std: bool = True,
) -> torch.Tensor:
    """A_i = (r_i - mean(r_group)) / (std(r_group) + eps), clipped to [-adv_clip, adv_clip].

    rewards: [B, G]; valid: [B, G] bool, rows that take part in their group's statistics
    (invalid rows get advantage 0). std is the unbiased sample std over the valid rows (GRPO's
    usual form). A group without two valid rows that differ gets advantage exactly 0 everywhere:
    with one row there is no std, and with equal rewards there is no signal, however the
    float arithmetic rounds (the statistics come from `group_stats`, in float64).
    scale_by_std=False keeps r_i - mean (Dr. GRPO): groups with a small spread are not blown up,
    so nearly-solved prompts do not get the same push as contested ones.
    """
    if valid is None:
        valid = torch.ones_like(rewards, dtype=torch.bool)
    stats = group_stats(rewards, valid)
    adv = stats.centered / (stats.std[:, None] + eps) if scale_by_std else stats.centered  # [B, G] float64
    return adv.clamp(-adv_clip, adv_clip).to(rewards.dtype)  # [B, G]; 0 outside informative groups
