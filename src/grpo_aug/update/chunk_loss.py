"""One chunk's part of an update's loss: the policy forward on the chunk's rows and the loss on it."""

from __future__ import annotations

from collections.abc import Callable

import torch

from grpo_aug.algo.loss import LossStats, PolicyObjective
from grpo_aug.engines.rows import select_rows, trim
from grpo_aug.step_types import ChunkStats, PreparedStep, UpdateStats
from grpo_aug.update.scoring import Scorer


def entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """[c, t] bool: the loss tokens whose entropy is at least the (1 - quantile) quantile of the loss
    tokens' entropies (torch.quantile's linear interpolation); no token where mask is 0."""
    on = mask > 0
    if not on.any():
        return on
    # quantile needs float32 at least; compared in the entropies' own precision if higher
    threshold = torch.quantile(entropy[on].to(torch.promote_types(entropy.dtype, torch.float32)), 1.0 - quantile)
    return (entropy >= threshold) & on


def chunk_loss(policy: torch.nn.Module, scorer: Scorer, objective: PolicyObjective, correct: Callable,
               step: PreparedStep, rows: torch.Tensor, beta: float, aggregate: Callable, entropy: bool = False,
               top_entropy_quantile: float = 1.0, update_tokens: torch.Tensor | None = None,
               ) -> tuple[torch.Tensor, ChunkStats]:
    """The loss of `rows` (indices into the step's rows), on them trimmed to their longest completion.

    correct: algo.engine_correction, for rows an external engine sampled. entropy: measure the
    policy's entropy on this chunk (the first update of a rollout logs it); with an entropy bonus
    every chunk measures it, with its gradient. top_entropy_quantile < 1: the policy-gradient term
    and the entropy bonus act only on the chunk's loss tokens whose entropy is in that top share
    (`entropy_mask`); the KL term and the aggregation's denominators still count every loss token,
    as in TRL. update_tokens: the loss tokens of the whole update (every rank's), which the chunk's
    share of the entropy bonus is counted against (None: the chunk is the whole update).
    """
    part = trim(select_rows(step.rollout, rows))
    t = part.completion_mask.shape[1]
    bonus = objective.entropy_coef > 0
    if entropy or bonus or top_entropy_quantile < 1:
        logps, ent = scorer.logprobs(policy, part, with_entropy=True, entropy_grad=bonus)  # [c, t] each
    else:
        logps, ent = scorer.logprobs(policy, part), None  # [c, t]
    # with one update per rollout the policy is still the rollout policy: no extra forward
    old = logps.detach() if step.old_logps is None else step.old_logps[rows, :t]  # [c, t]
    mask = step.mask[rows, :t]  # [c, t]
    correction = None
    if step.engine_sampled:  # pi_trainer / pi_engine at rollout time, the trainer's side being `old`
        correction = correct(old, part.sample_logprobs[:, :t].to(old.dtype), mask)
    if step.hinted is not None and bool(step.hinted[rows].any()):
        # rows sampled under a hinted prompt: the ratio's denominator is their sampler's log-prob
        # there (an importance weight against the original prompt, bounded by the clip)
        old = torch.where(step.hinted[rows, None], part.sample_logprobs[:, :t].to(old.dtype), old)  # [c, t]
        if correction is not None:  # their ratio is against the sampler already: no second weight
            hinted = step.hinted[rows, None].expand_as(mask)  # [c, t]
            correction = correction._replace(weight=correction.weight.masked_fill(hinted, 1.0),
                                             ratio=correction.ratio.masked_fill(hinted, 1.0),
                                             masked=correction.masked & ~hinted)
    ref = None if step.ref_logps is None else step.ref_logps[rows, :t]  # [c, t]
    kept = None if top_entropy_quantile == 1 else entropy_mask(ent.detach(), mask, top_entropy_quantile)  # [c, t]
    share = mask.sum() / update_tokens.clamp(min=1.0) if update_tokens is not None else 1.0
    loss, measured = objective(logps, ref, old, step.advantages[rows], mask, beta, aggregate, entropy=ent,
                               kept=kept, is_weight=None if correction is None else correction.weight,
                               bonus_share=share)
    stats = ChunkStats(measured, tokens=mask.sum())
    if kept is not None:
        stats = stats._replace(entropy_kept=kept.sum() / mask.sum().clamp(min=1))
    if correction is not None:
        on, n = mask > 0, mask.sum().clamp(min=1)
        stats = stats._replace(
            is_ratio_mean=(correction.ratio * mask).sum() / n,
            is_ratio_max=correction.ratio[on].max() if on.any() else torch.zeros((), device=mask.device),
            is_masked_frac=correction.masked.sum() / n)
    if ent is not None:
        stats = stats._replace(entropy=(ent.detach() * mask).sum() / mask.sum().clamp(min=1))
    if entropy and part.sample_logprobs is not None:  # the rollout's first update: the sampling policy itself
        gap = (logps.detach() - part.sample_logprobs[:, :t]).abs()  # [c, t]
        stats = stats._replace(logprob_gap=(gap * mask).sum() / mask.sum().clamp(min=1))
    return loss, stats


MAXIMA = frozenset({"kl_max", "ratio_max", "is_ratio_max"})


def update_stats(loss: torch.Tensor, nonfinite: torch.Tensor, skipped: torch.Tensor, chunks: list[ChunkStats],
                 device) -> UpdateStats:
    """An update's statistics from its chunks': means weighted by the loss tokens of the chunks that
    measured the statistic, maxima for the *_max ones, 0 where no chunk measured it."""
    def merged(name: str) -> torch.Tensor:
        measured = [(getattr(c.loss, name) if name in LossStats._fields else getattr(c, name), c.tokens)
                    for c in chunks]
        measured = [(value, tokens) for value, tokens in measured if value is not None]
        if not measured:
            return torch.zeros((), device=device)
        values = torch.stack([value for value, _ in measured])
        if name in MAXIMA:
            return values.max()
        tokens = torch.stack([tokens for _, tokens in measured]).float()
        return (values * tokens).sum() / tokens.sum().clamp(min=1)

    return UpdateStats(loss, nonfinite, skipped, **{name: merged(name) for name in UpdateStats._fields[3:]})

