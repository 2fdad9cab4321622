"""What one GRPO step carries from the rollout to the update, and what it reports afterwards."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from grpo_aug.algo.group_stats import counted_mean
from grpo_aug.algo.masks import loops
from grpo_aug.junk_chars import junk_count
from grpo_aug.report import StepReport, text_samples
from grpo_aug.step_types import PreparedStep, UpdateStats


def step_report(step: PreparedStep, updates: UpdateStats, kl_mean: torch.Tensor,
                ladder: tuple[float, ...]) -> StepReport:
    """What the callbacks get from one step (updates: per-update stats, [U] each)."""
    sampled = step.sampled
    G = sampled.valid.shape[1]  # group_size, or the per-prompt budget's largest group
    present = sampled.rows_present  # [N, G]
    counted_in_update = step.valid[step.groups][present[step.groups]]  # [B*G]
    device = kl_mean.device
    junk, chars = junk_count([p.prompt for p in sampled.prompts for _ in range(G)], sampled.rollout.texts)
    # the update's advantages in the [B, G] layout (0 in the slots of rows a budget did not roll out)
    laid_out = torch.zeros(len(step.groups), G, dtype=step.advantages.dtype, device=step.advantages.device)
    laid_out[present[step.groups].to(laid_out.device)] = step.update_advantages
    ro, rows = sampled.rollout, present.reshape(-1).to(sampled.rollout.input_ids.device)
    completion_ids, written = ro.input_ids[:, ro.prompt_len:].cpu(), ro.written.bool().cpu()  # [N*G, T] each
    looping = torch.tensor([loops(ids[keep].tolist()) for ids, keep in zip(completion_ids, written, strict=True)],
                           device=device)[rows.to(device)]  # [R]
    tools = None if ro.tool_calls is None else dict(
        tool_calls=ro.tool_calls[rows], tool_failures=ro.tool_failures[rows],
        tool_tokens=ro.given[rows].sum(dim=1), row_tokens=ro.completion_mask[rows].sum(dim=1))
    return StepReport(
        buckets=tuple(p.bucket for p in sampled.prompts), rewards=sampled.rewards, scored=sampled.scored,
        counted=sampled.valid, present=present,
        valid=step.valid, distinct=sampled.distinct, temperatures=sampled.rollout.temperatures,
        lengths=sampled.rollout.written.sum(dim=1)[present.reshape(-1)],
        truncated=sampled.rollout.truncated[present.reshape(-1).to(sampled.rollout.truncated.device)],
        advantages=step.update_advantages[counted_in_update], loss_tokens=step.mask.sum(),
        generated_tokens=step.generated_tokens,
        refill_rounds=torch.tensor(float(sampled.rounds - 1), device=device),
        refill_exhausted=torch.tensor(float(step.refill_exhausted), device=device),
        kl_mean=kl_mean, kl_max=updates.kl_max.max(), entropy_mean=updates.entropy[0],
        clip_frac=updates.clip_frac.mean(), clip_frac_low=updates.clip_frac_low.mean(),
        clip_frac_high=updates.clip_frac_high.mean(), nonfinite=updates.skipped.sum(),
        junk_chars=torch.tensor(float(junk), device=device),
        completion_chars=torch.tensor(float(chars), device=device), ladder=tuple(ladder),
        samples=text_samples(sampled, step.groups, laid_out.reshape(-1), G), looping=looping, **(tools or {}))


def train_scalars(step: PreparedStep, summary: UpdateStats, beta: float, skipped_total: int,
                  reward_errors: Mapping[str, int], reward_timeouts: Mapping[str, int] | None,
                  oversampled: bool = False, dual_clip: bool = False, entropy_masked: bool = False) -> dict:
    """train/* and reward/* for one step; running counts are this run's so far."""
    sampled = step.sampled
    values = {
        "train/loss": summary.loss.mean(),
        "train/reward": counted_mean(sampled.rewards, sampled.scored),
        "train/beta": torch.tensor(float(beta)),
        "train/effective_token_ratio": step.mask.sum() / step.generated_tokens.clamp(min=1),
        "train/skipped_nonfinite": torch.tensor(float(skipped_total)),
    }
    if step.mask.sum() > 0:  # token statistics of an update without tokens are 0 / 0
        values["train/ratio_max"] = summary.ratio_max.max()
        values["train/kl_max"] = summary.kl_max.max()
        values["train/clip_frac"] = summary.clip_frac.mean()
        values["train/clip_frac_low"] = summary.clip_frac_low.mean()
        values["train/clip_frac_high"] = summary.clip_frac_high.mean()
        values["train/ratio_mean"] = summary.ratio_mean.mean()
        if dual_clip:
            values["train/clip_frac_dual"] = summary.clip_frac_dual.mean()
        if entropy_masked:  # algo.top_entropy_quantile < 1: loss tokens the policy gradient acted on
            values["train/entropy_kept_frac"] = summary.entropy_kept.mean()
        if step.rollout.sample_logprobs is not None:  # mean |sampler - trainer| log-prob per loss token
            values["rollout/logprob_gap"] = summary.logprob_gap[0]
        if step.engine_sampled:  # the mismatch correction's ratio pi_trainer / pi_engine, before its cap
            values["rollout/is_ratio_mean"] = summary.is_ratio_mean.mean()
            values["rollout/is_ratio_max"] = summary.is_ratio_max.max()
            values["rollout/is_masked_frac"] = summary.is_masked_frac.mean()
    for name, scores in sampled.parts.items():
        scored = ~scores.isnan()
        if scored.any():
            values[f"reward/{name}/mean"] = scores[scored].mean()
        values[f"reward/errors/{name}"] = torch.tensor(float(reward_errors[name]))
        if reward_timeouts is not None:
            values[f"reward/timeouts/{name}"] = torch.tensor(float(reward_timeouts[name]))
    if oversampled:
        values["rollout/oversample_std_gain"] = sampled.std_gain.mean()
    if sampled.reflected is not None:
        values["rollout/reflected_rows"] = sampled.reflected.sum().float()
        if sampled.reflected.any():  # how often the hint or the reference prefix led to the right answer
            values["rollout/reflected_reward_mean"] = sampled.rewards[sampled.reflected].mean()
    return values
