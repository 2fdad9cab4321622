"""Group-relative advantages: each completion is judged only against its own group."""

from __future__ import annotations

import torch


def group_advantages(
    rewards: torch.Tensor,
    valid: torch.Tensor | None = None,
    adv_clip: float = 10.0,
    eps: float = 1e-6,
    scale_by_std: bool = True,
) -> torch.Tensor:
    """A_i = (r_i - mean(r_group)) / (std(r_group) + eps), clipped to [-adv_clip, adv_clip].

    rewards: [B, G]; valid: [B, G] bool, rows that take part in their group's statistics
    (invalid rows get advantage 0). std is the unbiased sample std over the valid rows, as
    torch.std in the seed. A group with fewer than 2 valid rows has no defined std and gets
    advantage 0 everywhere: dividing by a fake std would invent a training signal.
    scale_by_std=False keeps r_i - mean (Dr. GRPO): groups with a small spread are not blown up,
    so nearly-solved prompts do not get the same push as contested ones.
    """
    if valid is None:
        valid = torch.ones_like(rewards, dtype=torch.bool)
    v = valid.to(rewards.dtype)  # [B, G]
    n = v.sum(dim=1, keepdim=True)  # [B, 1]
    mean = (rewards * v).sum(dim=1, keepdim=True) / n.clamp(min=1.0)  # [B, 1]
    var = (((rewards - mean) ** 2) * v).sum(dim=1, keepdim=True) / (n - 1.0).clamp(min=1.0)  # [B, 1]
    adv = (rewards - mean) / (var.sqrt() + eps) if scale_by_std else rewards - mean  # [B, G]
    adv = adv.clamp(-adv_clip, adv_clip)
    return torch.where(valid & (n >= 2), adv, torch.zeros_like(adv))  # [B, G]

