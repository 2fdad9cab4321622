"""KL estimators between the policy and the frozen reference, per token."""

from __future__ import annotations

import torch


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor, bound: float) -> torch.Tensor:
    """k3 estimator exp(d) - d - 1 with d = ref - logp (Schulman): unbiased, >= 0, low variance.

    d is clamped to [-bound, bound] first: exp overflows float32 near d = 88 and a single such
    token would make the whole loss inf. Inside the bound the value is exact.
    """
    d = (ref_logps - logps).clamp(-bound, bound)  # [..., T]
    return torch.exp(d) - d - 1.0
