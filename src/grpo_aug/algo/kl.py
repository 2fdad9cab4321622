"""KL(policy || reference) estimators per token, from sampled tokens (Schulman's k1/k2/k3).

With d = ref_logp - logp on a token sampled from the policy:
    k1 = -d                 unbiased, can be negative, high variance
    k2 = d^2 / 2            biased, >= 0, low variance
    k3 = exp(d) - d - 1     unbiased, >= 0, low variance (the GRPO paper's choice)
d is clamped to [-bound, bound] first: exp overflows float32 near d = 88 and one such token
would make the whole loss inf. Inside the bound the values are exact.
"""

from __future__ import annotations

import torch


def _diff(logps: torch.Tensor, ref_logps: torch.Tensor, bound: float) -> torch.Tensor:
    return (ref_logps - logps).clamp(-bound, bound)  # [..., T]


def k1_kl(logps: torch.Tensor, ref_logps: torch.Tensor, bound: float) -> torch.Tensor:
    return -_diff(logps, ref_logps, bound)


def k2_kl(logps: torch.Tensor, ref_logps: torch.Tensor, bound: float) -> torch.Tensor:
    return 0.5 * _diff(logps, ref_logps, bound) ** 2


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor, bound: float) -> torch.Tensor:
    d = _diff(logps, ref_logps, bound)
    return torch.exp(d) - d - 1.0

