"""The clipped GRPO objective with a KL penalty to the reference model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from grpo_aug.algo.aggregate import RowMean
from grpo_aug.algo.kl import k3_kl
from grpo_aug.algo.ratio import TokenRatio

# Log-ratios (policy vs rollout policy, reference vs policy) are clamped to +-20 before exp:
# e^20 ~ 4.9e8 is finite in float32 with room for the products that follow, and a token whose
# probability moved by e^20 is already clipped by the PPO ratio clip (eps ~ 0.2) anyway.
LOG_RATIO_BOUND = 20.0

KLFn = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
Aggregate = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
RatioFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class LossStats(NamedTuple):
    """What the loss measured on its tokens, detached, each []: means over the loss tokens,
    maxima over them (0 without any)."""

    kl_mean: torch.Tensor
    kl_max: torch.Tensor
    clip_frac_low: torch.Tensor  # tokens clipped at 1 - eps_low (where that side binds)
    clip_frac_high: torch.Tensor
    clip_frac: torch.Tensor  # either side
    clip_frac_dual: torch.Tensor  # negative-advantage tokens capped by the dual clip
    ratio_mean: torch.Tensor
    ratio_max: torch.Tensor


def policy_loss(
    logps: torch.Tensor,
    ref_logps: torch.Tensor | None,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.04,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    kl: KLFn = k3_kl,
    aggregate: Aggregate = RowMean(),
    ratio: RatioFn = TokenRatio(),
    clip_ratio_c: float | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    kept: torch.Tensor | None = None,
    surrogate=None,
    is_weight: torch.Tensor | None = None,
    kl_ratio_weighted: bool = False,
    bonus_share: float | torch.Tensor = 1.0,
) -> tuple[torch.Tensor, LossStats]:
    """-(clipped surrogate - beta * KL + entropy_coef * H), aggregated over masked tokens; plus detached stats.

    logps/ref_logps/old_logps/mask/entropy: [..., T]; advantages: [...] (one per row). The ratio
    (per token, or per row with GSPO's `ratio`) is clipped to [1 - clip_eps_low, 1 + clip_eps_high]
    (DAPO's clip-higher when high > low). `clip_ratio_c` is verl's dual clip: a negative-advantage
    token's objective is at least clip_ratio_c * A, so one huge ratio cannot dominate the update.
    ref_logps None (no reference model: beta is 0 for the whole run) means no KL term.
    `entropy` must carry gradient when entropy_coef > 0 (the bonus rewards spread-out distributions).
    `kept` [..., T] bool: the tokens the policy-gradient term and the entropy bonus act on (the
    top_entropy_quantile mask; None: every loss token); the KL keeps every loss token.
    `is_weight` [..., T] (detached): the engine-trainer mismatch correction (algo/engine_correction),
    which multiplies each token's policy-gradient term, not its KL; a surrogate that weighs whole
    rows (VESPO) folds its log into the row's weight instead, as TRL 1.16 does.
    `kl_ratio_weighted`: the KL estimate of each token times its (differentiable) importance ratio,
    TRL's `use_bias_correction_kl`: the rows were sampled by the old policy, not the current one.
    The entropy bonus is, as in TRL, the mean entropy over the tokens it acts on, whatever the
    loss's aggregation; `bonus_share` is this call's share of the update's loss tokens (its rows
    are a chunk of the update), so that the chunks' bonuses add up to a token-weighted mean.
    `surrogate`: a policy-gradient term from algo/objectives.py in place of the PPO clip (None:
    the clip; the clip settings are then unused).
    """
    T = logps.shape[-1]
    mask = mask.to(logps.dtype)
    token_log_ratio = (logps - old_logps).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # [..., T]
    log_ratio = ratio(token_log_ratio, mask)  # [..., T] or [..., 1]
    ratio_t = torch.exp(log_ratio).expand_as(logps)  # [..., T]
    adv = advantages.unsqueeze(-1)  # [..., 1]
    if surrogate is None:
        pg, low, high, dual = clipped_pg(ratio_t, adv, clip_eps_low, clip_eps_high, clip_ratio_c)  # [..., T] each
    else:
        pg, low, high, dual, is_weight = surrogate_pg(surrogate, token_log_ratio, logps, adv, mask, ratio_t,
                                                      is_weight)  # [..., T] each
    if ref_logps is None:
        kl_tokens = torch.zeros_like(logps)  # [..., T]
    else:
        kl_tokens = kl(logps, ref_logps, LOG_RATIO_BOUND)  # [..., T]
        if kl_ratio_weighted:
            kl_tokens = kl_tokens * ratio_t  # [..., T]
    if is_weight is not None:
        pg = pg * is_weight  # [..., T]
    if kept is not None:
        pg = pg * kept.to(pg.dtype)  # [..., T]
    per_token = pg - beta * kl_tokens  # [..., T]
    loss = -aggregate(per_token.reshape(-1, T), mask.reshape(-1, T))
    if entropy_coef and entropy is not None:
        acts = mask if kept is None else mask * kept.to(mask.dtype)  # [..., T]
        loss = loss - entropy_coef * bonus_share * (entropy * acts).sum() / acts.sum().clamp(min=1.0)

    return loss, loss_stats(mask, kl_tokens, ratio_t, low, high, dual)


def surrogate_pg(surrogate, token_log_ratio: torch.Tensor, logps: torch.Tensor, adv: torch.Tensor,
                 mask: torch.Tensor, ratio_t: torch.Tensor, is_weight: torch.Tensor | None):
    """An algo/surrogate term in place of the clip: (pg, low, high, dual) [..., T] each, and the
    engine correction's token weights left to apply (None where the surrogate folded them into its
    row weight, as VESPO does)."""
    dual = torch.zeros_like(logps, dtype=torch.bool)  # [..., T] the dual clip belongs to the PPO clip
    folds = is_weight is not None and getattr(surrogate, "folds_is_weight", False)
    extra = {"is_weight": is_weight} if folds else {}
    pg, bounds = surrogate.pg(token_log_ratio, logps, adv, mask, ratio_t, **extra)  # [..., T]
    return pg, bounds["low"], bounds["high"], dual, None if folds else is_weight


def clipped_pg(ratio_t: torch.Tensor, adv: torch.Tensor, clip_eps_low: float, clip_eps_high: float,
               clip_ratio_c: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped term min(r A, clip(r) A) per token ([..., T] ratio, [..., 1] advantages), with
    verl's dual clip; and where the clip bound (low side, high side) and where the dual clip did."""
    clipped = ratio_t.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)  # [..., T]
    pg = torch.min(ratio_t * adv, clipped * adv)  # [..., T]
    dual = torch.zeros_like(ratio_t, dtype=torch.bool)  # [..., T]
    if clip_ratio_c is not None:
        dual = (adv < 0) & (pg < clip_ratio_c * adv)  # [..., T]
        pg = torch.where(dual, clip_ratio_c * adv.expand_as(pg), pg)
    with torch.no_grad():
        low = (ratio_t < 1.0 - clip_eps_low) & (adv < 0)  # the min picked the clipped side
        high = (ratio_t > 1.0 + clip_eps_high) & (adv > 0)
    return pg, low, high, dual


@torch.no_grad()
def loss_stats(mask: torch.Tensor, kl_tokens: torch.Tensor, ratio_t: torch.Tensor, low: torch.Tensor,
               high: torch.Tensor, dual: torch.Tensor) -> LossStats:
    """The loss's statistics over its loss tokens (mask [..., T] in the log-probs' dtype)."""
    on = mask > 0
    n = mask.sum().clamp(min=1.0)
    low, high = low & on, high & on
    zero = torch.zeros((), dtype=mask.dtype, device=mask.device)
    return LossStats(
        kl_mean=(kl_tokens * mask).sum() / n,
        kl_max=torch.where(on, kl_tokens, zero).max() if on.any() else zero,
        clip_frac_low=low.sum() / n,
        clip_frac_high=high.sum() / n,
        clip_frac=(low | high).sum() / n,
        clip_frac_dual=(dual & on).sum() / n,
        ratio_mean=(ratio_t * mask).sum() / n,
        ratio_max=torch.where(on, ratio_t, zero).max() if on.any() else zero,
    )


@dataclass(frozen=True)
class PolicyObjective:
    """policy_loss with its settings held (built from `algo` by AlgoSettings.objective): called on
    one chunk's tensors, with the step's beta and the update's aggregation. The policy-gradient
    term is the clip, or the `surrogate` named by algo/surrogate (algo/objectives.py: cispo, sapo,
    vespo)."""

    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    kl: KLFn = k3_kl
    ratio: RatioFn = field(default_factory=TokenRatio)
    clip_ratio_c: float | None = None
    entropy_coef: float = 0.0
    surrogate: Any = None  # algo/objectives.py's term in place of the clip; None: the clip
    kl_ratio_weighted: bool = False

    def __call__(self, logps: torch.Tensor, ref_logps: torch.Tensor | None, old_logps: torch.Tensor,
                 advantages: torch.Tensor, mask: torch.Tensor, beta: float, aggregate: Aggregate,
                 entropy: torch.Tensor | None = None, kept: torch.Tensor | None = None,
                 is_weight: torch.Tensor | None = None, bonus_share: float | torch.Tensor = 1.0,
                 ) -> tuple[torch.Tensor, LossStats]:
        return policy_loss(logps, ref_logps, old_logps, advantages, mask, beta=beta, clip_eps_low=self.clip_eps_low,
                           clip_eps_high=self.clip_eps_high, kl=self.kl, aggregate=aggregate, ratio=self.ratio,
                           clip_ratio_c=self.clip_ratio_c, entropy=entropy, entropy_coef=self.entropy_coef,
                           kept=kept, surrogate=self.surrogate, is_weight=is_weight,
                           kl_ratio_weighted=self.kl_ratio_weighted, bonus_share=bonus_share)
