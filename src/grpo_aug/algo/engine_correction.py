"""Engine-trainer mismatch correction (`algo/engine_correction=...`): an importance weight for
rows sampled by an external engine (vLLM), whose kernels give slightly different probabilities
than the trainer's forward for the same weights.

The weight is pi_trainer(y) / pi_engine(y) at rollout time, detached, and multiplies the policy-
gradient term of each token (not the KL), as TRL's `vllm_importance_sampling_correction` and
verl's `rollout_correction` do. It is capped so that one token the engine under-rated cannot
dominate the update:

    none               weight 1
    token_truncate     min(ratio_t, cap) per token
    token_mask         ratio_t, or 0 where ratio_t > cap
    sequence_truncate  min(prod_t ratio_t, cap), one per row, broadcast to its tokens
    sequence_mask      prod_t ratio_t, or 0 for the whole row where it exceeds cap

All take trainer and engine log-probs [..., T] and the loss mask [..., T], and return a
Correction: the weights, the uncapped ratio (for the dashboard) and the tokens the cap zeroed.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from grpo_aug.algo.loss import LOG_RATIO_BOUND
from grpo_aug.errors import UsageError


class Correction(NamedTuple):
    weight: torch.Tensor  # [..., T] multiplies each token's policy-gradient term; detached
    ratio: torch.Tensor  # [..., T] pi_trainer / pi_engine before the cap (per row for sequence levels)
    masked: torch.Tensor  # [..., T] bool: loss tokens whose weight the cap set to 0


class NoCorrection:
    active = False

    def __call__(self, trainer_logps: torch.Tensor, engine_logps: torch.Tensor, mask: torch.Tensor) -> Correction:
        ones = torch.ones_like(trainer_logps)
        return Correction(ones, ones, torch.zeros_like(mask, dtype=torch.bool))


class _Capped:
    active = True
    per_row = False
    truncate = True

    def __init__(self, cap: float = 3.0) -> None:
        if not cap >= 1:
            raise UsageError(f"algo.engine_correction.cap must be >= 1 (a weight of 1 is no correction), got {cap}")
        self.cap = float(cap)

    def __call__(self, trainer_logps: torch.Tensor, engine_logps: torch.Tensor, mask: torch.Tensor) -> Correction:
        on = mask.to(trainer_logps.dtype)  # [..., T]
        log_ratio = (trainer_logps - engine_logps).detach() * on  # [..., T]
        if self.per_row:
            log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(trainer_logps)  # [..., T] the row's
        ratio = log_ratio.clamp(max=LOG_RATIO_BOUND).exp()  # [..., T]
        over = ratio > self.cap  # [..., T]
        if self.truncate:
            return Correction(ratio.clamp(max=self.cap), ratio, torch.zeros_like(over))
        return Correction(torch.where(over, torch.zeros_like(ratio), ratio), ratio, over & (mask > 0))


class TokenTruncate(_Capped):
    pass


class TokenMask(_Capped):
    truncate = False


class SequenceTruncate(_Capped):
    per_row = True


class SequenceMask(_Capped):
    per_row = True
    truncate = False
