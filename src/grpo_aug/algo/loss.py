"""The clipped GRPO objective with a k3 KL penalty to the reference model."""

from __future__ import annotations

import torch

from grpo_aug.algo.advantages import group_advantages
from grpo_aug.algo.kl import k3_kl

# Log-ratios (policy vs rollout policy, reference vs policy) are clamped to +-20 before exp:
# e^20 ~ 4.9e8 is finite in float32 with room for the products that follow, and a token whose
# probability moved by e^20 is already clipped by the PPO ratio clip (eps ~ 0.2) anyway.
LOG_RATIO_BOUND = 20.0


def policy_loss(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.04,
    clip_eps: float = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate minus beta * k3 KL; per-row masked token mean, then mean over rows.

    logps/ref_logps/old_logps/mask: [B, G, T]; advantages: [B, G]. Returns the scalar loss and
    detached stats. A row whose mask is all zero contributes exactly 0 (its mean is 0/1).
    """
    mask = mask.to(logps.dtype)
    log_ratio = (logps - old_logps).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # [B, G, T]
    ratio = torch.exp(log_ratio)  # [B, G, T]
    adv = advantages.unsqueeze(-1)  # [B, G, 1]
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    pg = torch.min(ratio * adv, clipped * adv)  # [B, G, T]
    kl = k3_kl(logps, ref_logps, LOG_RATIO_BOUND)  # [B, G, T]
    per_token = (pg - beta * kl) * mask  # [B, G, T]
    tokens = mask.sum(dim=-1)  # [B, G]
    per_row = per_token.sum(dim=-1) / tokens.clamp(min=1.0)  # [B, G]
    loss = -per_row.mean()

    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        low = (ratio < 1.0 - clip_eps) & (adv < 0)  # the min picked the clipped side
        high = (ratio > 1.0 + clip_eps) & (adv > 0)
        stats = {
            "kl_mean": (kl * mask).sum() / n,
            "clip_frac": ((low | high).to(mask.dtype) * mask).sum() / n,
            "ratio_mean": (ratio * mask).sum() / n,
        }
    return loss, stats


def grpo_loss_with_stats(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    old_logps: torch.Tensor,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.04,
    clip_eps: float = 0.2,
    adv_clip: float = 10.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """grpo_loss plus detached stats (kl_mean, clip_frac, ratio_mean, advantages)."""
    adv = group_advantages(rewards, adv_clip=adv_clip)  # [B, G]
    loss, stats = policy_loss(logps, ref_logps, old_logps, adv, mask, beta=beta, clip_eps=clip_eps)
    stats["advantages"] = adv.detach()
    return loss, stats


def grpo_loss(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    old_logps: torch.Tensor,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.04,
    clip_eps: float = 0.2,
    adv_clip: float = 10.0,
) -> torch.Tensor:
    """The seed's scalar form: logps/ref_logps/old_logps/mask [B, G, T], rewards [B, G] -> loss."""
    return grpo_loss_with_stats(logps, ref_logps, old_logps, rewards, mask, beta, clip_eps, adv_clip)[0]
