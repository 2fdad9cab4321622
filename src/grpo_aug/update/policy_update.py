"""Stage 3 of a step, the policy update: from a step's rolled-out groups to algo.num_iterations x
algo.minibatches optimizer steps.

`prepare` computes once per rollout what every update needs (the groups that enter, the loss
mask, the advantages, the reference and rollout-policy log-probs); `train` runs the updates, each
in length chunks (and micro-batches) with its own backward. Holds the `algo` settings, the loss
object built from them and the beta schedule, whose state is this stage's `state_dict`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from grpo_aug.algo import group_advantages
from grpo_aug.algo.advantages import batch_reward_std
from grpo_aug.algo.masks import TokenText
from grpo_aug.algo.optim import clip_gradients_, gradient_norm
from grpo_aug.algo.settings import AlgoSettings
from grpo_aug.engines.rows import select_rows
from grpo_aug.errors import UsageError
from grpo_aug.fast_llama.decode import sharded
from grpo_aug.step_types import PreparedStep, SampledGroups, UpdateStats
from grpo_aug.update import chunk_loss as chunk_loss_lib
from grpo_aug.update.lockstep import lockstep, stand_in
from grpo_aug.update.scoring import Scorer

log = logging.getLogger(__name__)


def group_rows(groups: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Row indices of the groups `groups` ([b]) in a [N, G] layout, the rows `present` ([N, G]) only."""
    G = present.shape[1]
    slots = groups[:, None] * G + torch.arange(G, device=groups.device)  # [b, G]
    return slots[present[groups].to(groups.device)]  # [rows]


class OptimizerHandle(NamedTuple):
    """What the module lends an update: its optimizer and schedule, Lightning's backward (mixed
    precision, strategies) and the step number for messages."""

    optimizer: Any
    schedule: Any
    backward: Callable[[torch.Tensor], None]
    global_step: int


class PolicyUpdate:
    def __init__(self, algo: AlgoSettings | None = None) -> None:
        self.algo = algo or AlgoSettings()
        self.objective = self.algo.objective
        self.loss_mask = self.algo.loss_mask
        self.scorer = Scorer(self.algo.length_chunks, micro_batch_rows=self.algo.micro_batch_rows)
        self.token_text: TokenText | None = None
        self.ranks = None

    def bind(self, tokenizer, ranks) -> None:
        """The tokenizer (for the template masks) and the module's rank reductions (distributed.Ranks)."""
        self.token_text = TokenText(tokenizer)
        self.ranks = ranks
        self.scorer.reduce_mean, self.scorer.reduce_max = ranks.mean, ranks.max

    def state_dict(self) -> dict:
        return {"beta": self.algo.beta.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.algo.beta.load_state_dict(state.get("beta", {}))

    def prepare(self, policy: torch.nn.Module, sampled: SampledGroups, reference) -> PreparedStep:
        """Everything the updates need, computed once per rollout; no optimizer involved.
        reference: a context giving the reference model (models.policy.PolicyModels.reference).
        The groups that enter are those the rollout kept (`sampled.kept`). Rows sampled from older
        weights (`sampled.versions`, rollout.ahead >= 1) take their sampler's log-probs as the
        ratio's denominator, which also hold an external engine's kernel mismatch, so they get no
        separate engine correction."""
        a = self.algo
        off_policy = sampled.versions is not None
        valid = sampled.valid & sampled.kept[:, None]  # [N, G]
        groups = sampled.kept.nonzero().squeeze(1)  # [B] the groups that enter the update
        present = sampled.rows_present[groups]  # [B, G] a per-prompt budget leaves groups short of G rows
        rows = group_rows(groups, sampled.rows_present)  # [B*G] (fewer under a budget)
        counted = valid[groups][present]  # [B*G]
        empty = len(rows) == 0
        if empty:  # no group entered here: the stand-in row, no loss token, pairs this rank's forwards with others'
            rows, counted = stand_in(valid.device), torch.zeros(1, dtype=torch.bool, device=valid.device)  # [1]
        ro = sampled.rollout if len(rows) == len(sampled.rollout.texts) else select_rows(sampled.rollout, rows)

        # which tokens carry loss: padding, truncation, scaffolding, repeats, left-out rows
        mask = self.loss_mask(ro.input_ids[:, ro.prompt_len :], ro.completion_mask, ro.truncated,
                              counted, self.token_text, ro.given)  # [B*G, T]

        # advantages from the step's (optionally winsorised) rewards, within each group
        rewards = self.algo.winsorize(sampled.rewards[groups], valid[groups])  # [B, G]
        batch_std = None
        if a.scale_rewards.needs_batch_std:  # every counted reward of the step, flat groups and all ranks included
            batch_std = batch_reward_std(self.algo.winsorize(sampled.rewards, sampled.valid), sampled.valid,
                                         self.ranks.sum)
        advantages = group_advantages(rewards, valid[groups], adv_clip=a.adv_clip, scale=a.scale_rewards,
                                      batch_std=batch_std)[present]  # [B*G]
        if empty:
            advantages = torch.zeros(1, device=advantages.device)  # [1] the stand-in's

        # reference log-probs, and the rollout policy's when it changes before the last update
        ref_logps = old_logps = None
        chunks = self.scorer.chunks(policy, ro.completion_mask.sum(dim=1), ro.prompt_len)
        with torch.no_grad():
            if a.needs_reference:
                with reference() as model:
                    ref_logps = self.scorer.logprobs(model, ro, chunks)  # [B*G, T]
            if off_policy:
                if ro.sample_logprobs is None:
                    raise UsageError("rollout.ahead >= 1 needs the sampler's log-probs, and this engine reports none")
                old_logps = ro.sample_logprobs.to(ro.input_ids.device)  # [B*G, T]
            elif a.updates_per_rollout > 1:
                old_logps = self.scorer.logprobs(policy, ro, chunks)  # [B*G, T]
        hinted = None if sampled.hinted is None else sampled.hinted[groups][present]  # [B*G]
        engine_sampled = (sampled.external and not off_policy and a.engine_correction.active
                          and ro.sample_logprobs is not None)
        return PreparedStep(sampled, groups, valid, ro, mask, advantages, ref_logps, old_logps,
                            sampled.refill_exhausted, hinted, engine_sampled, stand_in=empty)

    def train(self, policy: torch.nn.Module, step: PreparedStep, opt: OptimizerHandle
              ) -> tuple[UpdateStats, torch.Tensor, float]:
        """The clipped-loss updates over minibatches of whole groups. Returns the per-update stats
        ([U] each), the rank-mean KL of the first pass (what the beta schedule observes) and beta."""
        a = self.algo
        beta = a.beta(opt.global_step)
        parts = torch.tensor_split(torch.arange(len(step.groups)), a.minibatches)
        stats = [self.update(policy, step, beta, part, opt, entropy=(i == 0 and j == 0))
                 for i in range(a.num_iterations) for j, part in enumerate(parts)]
        updates = UpdateStats.stack(stats)  # [U] each
        kl_mean = self.ranks.reduce(updates.kl_mean[: a.minibatches].mean(), "mean")
        a.beta.observe(opt.global_step, kl_mean.item())
        return updates, kl_mean, beta

    def update(self, policy: torch.nn.Module, step: PreparedStep, beta: float, groups: torch.Tensor,
               opt: OptimizerHandle, entropy: bool) -> UpdateStats:
        """One optimizer step on `groups` (indices into the step's groups); returns detached stats.

        The loss is the global batch's, whatever the split over ranks: its normalisers (rows,
        tokens) are sums over ranks, and each rank's part is scaled by the number of ranks, which
        the strategy's gradient mean divides out again. Length-sorted chunks each run their own
        backward; their losses add up to the update's. Every rank runs as many parts as every
        other (update/lockstep.py). A non-finite chunk loss or gradient norm on any rank skips the
        update on every rank (no optimizer or lr step: weights and AdamW's moments stay
        bit-identical; `skipped` is 1); so does an update without a loss token on any rank (a zero
        gradient would still move every weight through AdamW's momentum), with `skipped` 0.
        """
        a, ro = self.algo, step.rollout
        device = ro.input_ids.device
        opt.optimizer.zero_grad()
        rows = step.rows_of(groups).to(device)  # [b*G] (fewer under a per-prompt budget)
        # the update's rows and loss tokens on every rank: the loss's normalisers (collective)
        local = torch.stack([torch.tensor(float(len(rows)), device=device), step.mask[rows].sum().float()])
        total_rows, total_tokens = self.ranks.sum(local).unbind()
        scale = float(self.ranks.world)  # the strategies average gradients over ranks
        aggregate = functools.partial(a.loss.part, rows=int(total_rows), tokens=total_tokens)
        chunk_loss = functools.partial(chunk_loss_lib.chunk_loss, policy, self.scorer, self.objective,
                                       a.engine_correction, step, top_entropy_quantile=a.top_entropy_quantile,
                                       update_tokens=total_tokens)
        parts, nonfinite = [], 0
        for chunk in self.scorer.chunks(policy, ro.completion_mask[rows].sum(dim=1), ro.prompt_len):
            part, weight = lockstep(rows, chunk)
            loss, stats = chunk_loss(part, beta, aggregate, entropy and weight > 0)
            loss = loss * weight
            finite = bool(torch.isfinite(loss))
            nonfinite += not finite
            opt.backward(loss * scale)  # a non-finite one too, so that every rank's collectives pair up
            parts.append((loss.detach() if finite else torch.zeros((), device=device),
                          stats if finite and weight else None))
        grad_norm = gradient_norm(policy)
        finite = bool(torch.isfinite(grad_norm))
        local = torch.tensor([float(nonfinite > 0 or not finite), float(grad_norm) ** 2 if finite else 0.0,
                              float(sum(loss for loss, _ in parts))], device=device)
        # one reduce, every rank; the squared norms add up to the whole model's only when sharded
        bad, norm_sq, loss_sum = self.ranks.reduce(local, "sum").tolist()
        skip, empty = bad > 0, float(total_tokens) == 0
        if skip:
            log.warning("step %d: non-finite %s; the update is skipped on every rank (weights unchanged)",
                        opt.global_step,
                        f"loss in {nonfinite} chunk(s)" if nonfinite else f"gradient norm {grad_norm}")
        if skip or empty:
            opt.optimizer.zero_grad(set_to_none=True)
            opt.optimizer.step()  # counts the step; with no gradient the optimizer touches nothing
        else:
            if a.max_grad_norm is not None:  # by hand: Lightning refuses to clip fused optimizers under bf16-mixed
                clip_gradients_(policy, a.max_grad_norm, norm_sq ** 0.5 if sharded(policy) else None)
            opt.optimizer.step()
            opt.schedule.step()
        return chunk_loss_lib.update_stats(
            torch.tensor(loss_sum, device=device),  # the global batch's
            torch.tensor(float(nonfinite), device=device), torch.tensor(float(skip), device=device),
            [st for _, st in parts if st is not None], device)
