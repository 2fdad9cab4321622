"""Policy-gradient terms other than the PPO clip (`algo/surrogate=clipped|cispo|sapo|vespo`).

Each gives the per-token policy-gradient term that algo/loss.py's `policy_loss` turns into the
loss (the KL penalty, the engine correction's weight, the entropy bonus and the aggregation stay
there). The conventions are TRL 1.16's `GRPOTrainer` (`loss_type`), whose papers they follow:

    clipped  min(r A, clip(r) A): PPO / GRPO / DAPO / GSPO (with algo/ratio=sequence); the default
    cispo    sg(min(r, max_ratio)) A log pi: the importance weight is capped and detached, so every
             token keeps its gradient, where the PPO clip would zero it (MiniMax-M1; TRL's
             `epsilon_high` is `max_ratio`, 5.0 as ScaleRL recommends)
    sapo     sigmoid(tau (r - 1)) 4 / tau A: a soft gate, weight 1 at r = 1 that fades smoothly as r
             leaves 1, tau_pos for positive advantages and the steeper tau_neg for the others (SAPO)
    vespo    sg(phi(w)) A log pi with w the row's sequence ratio (the product of its token ratios)
             and phi(w) = e^lambda w^k e^(-lambda w), 1 at w = 1, falling to 0 at both ends;
             (k, lambda) per advantage sign (VESPO). On rows an external engine sampled, w is
             against the sampler: the engine correction's capped token weights join w (token_*
             modes only), and no per-token weight multiplies the term (TRL 1.16)

LUSPO is GSPO's sequence ratio with each row's loss summed over its tokens, not averaged:
`algo/ratio=sequence algo/loss=row_sum` (conf/experiment/luspo.yaml).

`pg(log_ratio, logps, adv, mask, ratio)` takes the clamped per-token log-ratios [..., T], the
policy's log-probs [..., T], the advantages [..., 1], the loss mask and the ratio level's output
as a ratio [..., T]; it returns the term [..., T] and the token shares its bound acted on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grpo_aug.errors import UsageError


@dataclass(frozen=True)
class Clipped:
    """The PPO clip, computed by policy_loss itself with algo.clip_eps_low/high and clip_ratio_c."""

    name = "clipped"


@dataclass(frozen=True)
class CISPO:
    max_ratio: float = 5.0

    name = "cispo"

    def __post_init__(self) -> None:
        if not self.max_ratio > 1:
            raise UsageError(f"algo.surrogate.max_ratio must be > 1, got {self.max_ratio}")

    def pg(self, log_ratio, logps, adv, mask, ratio):
        weight = ratio.clamp(max=self.max_ratio).detach()  # [..., T]
        # the logged share counts capped tokens with A > 0 only, as TRL 1.16's cispo_clip_ratio does
        capped = (ratio > self.max_ratio) & (adv > 0)  # [..., T]
        return weight * adv * logps, {"low": torch.zeros_like(capped), "high": capped}


@dataclass(frozen=True)
class SAPO:
    tau_pos: float = 1.0
    tau_neg: float = 1.05

    name = "sapo"

    def __post_init__(self) -> None:
        if not (self.tau_pos > 0 and self.tau_neg > 0):
            raise UsageError(f"algo.surrogate.tau_pos and tau_neg must be > 0, got {self.tau_pos}, {self.tau_neg}")

    def pg(self, log_ratio, logps, adv, mask, ratio):
        tau = torch.where(adv > 0, ratio.new_tensor(self.tau_pos), ratio.new_tensor(self.tau_neg))  # [..., 1]
        s = torch.sigmoid(tau * (ratio - 1.0))  # [..., T]
        # the gradient is 4 s (1 - s) times the unclipped one (r A grad log pi): the clip stats
        # count the tokens where the gate has faded below half of it
        faded = 4.0 * s * (1.0 - s) < 0.5
        return s * 4.0 / tau * adv, {"low": faded & (ratio < 1), "high": faded & (ratio > 1)}


@dataclass(frozen=True)
class VESPO:
    k_pos: float = 2.0
    lambda_pos: float = 3.0
    k_neg: float = 3.0
    lambda_neg: float = 2.0

    name = "vespo"
    # rows an external engine sampled: the log of each token's capped engine/trainer weight joins the
    # row's log w (w = pi / pi_sampler), in place of a per-token multiply (TRL 1.16)
    folds_is_weight = True

    def __post_init__(self) -> None:
        if min(self.k_pos, self.lambda_pos, self.k_neg, self.lambda_neg) <= 0:
            raise UsageError(f"algo.surrogate k_pos, lambda_pos, k_neg, lambda_neg must be > 0, got {self.k_pos}, "
                             f"{self.lambda_pos}, {self.k_neg}, {self.lambda_neg}")

    def weights(self, seq_log_ratio: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        """phi(w) [..., 1], detached: w = exp(the row's summed token log-ratios [..., 1]), bounded to [1e-8, e^20]."""
        with torch.no_grad():
            log_w = seq_log_ratio.clamp(math.log(1e-8), 20.0)  # [..., 1]
            k = torch.where(adv >= 0, log_w.new_tensor(self.k_pos), log_w.new_tensor(self.k_neg))  # [..., 1]
            lam = torch.where(adv >= 0, log_w.new_tensor(self.lambda_pos), log_w.new_tensor(self.lambda_neg))
            return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(0.0, 0.0, 0.0)  # [..., 1]

    def pg(self, log_ratio, logps, adv, mask, ratio, is_weight=None):
        seq = (log_ratio * mask).sum(-1, keepdim=True)  # [..., 1]
        if is_weight is not None:  # a weight the cap set to 0 counts as 1e-8, as in TRL
            log_is = torch.log(is_weight.detach()).clamp(math.log(1e-8), 20.0)  # [..., T]
            seq = seq + (log_is * mask).sum(-1, keepdim=True)  # [..., 1]
        phi = self.weights(seq, adv)  # [..., 1]
        small = (phi < 0.5).expand_as(logps)  # rows the weighting kept at under half the plain gradient
        w_low = (seq < 0).expand_as(logps)
        return phi * adv * logps, {"low": small & w_low, "high": small & ~w_low}
