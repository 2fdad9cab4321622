"""The GRPO LightningModule: rollout, reward, group advantage and clipped loss in training_step."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple

import lightning as L
import torch
from torchmetrics.aggregation import SumMetric

from grpo_aug.algo import group_advantages, policy_loss, token_logprobs
from grpo_aug.algo.settings import LossSettings
from grpo_aug.data.records import BUCKETS, Prompt
from grpo_aug.models.loading import frozen_copy, load_policy, load_tokenizer
from grpo_aug.rewards import MathReward, RewardFunction, score_completions
from grpo_aug.rollout import Rollout, generate
from grpo_aug.rollout.filter import informative_groups
from grpo_aug.rollout.merge import concat_rollouts, select_rows
from grpo_aug.rollout.settings import RolloutSettings

log = logging.getLogger(__name__)


class SampledGroups(NamedTuple):
    prompts: list[Prompt]
    rollout: Rollout  # [n*G] rows
    rewards: torch.Tensor  # [n, G]
    parts: dict[str, torch.Tensor]  # per reward function, [n, G]
    distinct: torch.Tensor  # [n, G]
    valid: torch.Tensor  # [n, G]
    informative: torch.Tensor  # [n] groups whose counted rewards differ


def merge_rounds(rounds: list[SampledGroups], pad_id: int) -> SampledGroups:
    if len(rounds) == 1:
        return rounds[0]
    return SampledGroups(
        prompts=[p for r in rounds for p in r.prompts],
        rollout=concat_rollouts([r.rollout for r in rounds], pad_id),
        rewards=torch.cat([r.rewards for r in rounds]),
        parts={k: torch.cat([r.parts[k] for r in rounds]) for k in rounds[0].parts},
        distinct=torch.cat([r.distinct for r in rounds]),
        valid=torch.cat([r.valid for r in rounds]),
        informative=torch.cat([r.informative for r in rounds]),
    )


class GRPOModule(L.LightningModule):
    def __init__(
        self,
        name_or_path: str,
        optimizer: Callable[..., torch.optim.Optimizer],
        rewards: Sequence[RewardFunction],
        rollout: RolloutSettings,
        algo: LossSettings,
        dtype: str = "float32",
        eval_max_new_tokens: int | None = None,
        lr_warmup_steps: int = 0,
        prompt_pool: Callable[[str, int, int, int, set[str]], list[Prompt]] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer", "rewards", "rollout", "algo", "prompt_pool"])
        self.name_or_path = str(name_or_path)
        self.optimizer_factory = optimizer
        self.reward_functions = list(rewards)
        self.rollout_settings = rollout
        self.loss_settings = algo
        self.dtype_name = dtype
        self.eval_max_new_tokens = eval_max_new_tokens or rollout.max_new_tokens
        self.lr_warmup_steps = lr_warmup_steps
        if rollout.filter.refill and prompt_pool is None:
            raise ValueError("rollout.filter.refill needs a prompt pool (the DataModule's draw_prompts)")
        self.prompt_pool = prompt_pool  # (bucket, n, step, round, used ids) -> fresh prompts
        self.tokenizer = load_tokenizer(self.name_or_path)  # fails now if the path is wrong
        self.policy: torch.nn.Module | None = None
        # a list hides the reference from nn.Module registration: it is not trained, not in the
        # optimizer and not in checkpoints (it is reloaded from name_or_path on resume)
        self._frozen: list[torch.nn.Module] = []
        self.exact = MathReward()
        self.last_eval: dict[str, float] = {}
        self.val_correct = torch.nn.ModuleDict({b: SumMetric() for b in BUCKETS})
        self.val_total = torch.nn.ModuleDict({b: SumMetric() for b in BUCKETS})

    @property
    def reference(self) -> torch.nn.Module:
        return self._frozen[0]

    def configure_model(self) -> None:
        if self.policy is not None:  # Lightning may call this more than once
            return
        self.policy = load_policy(self.name_or_path, self.dtype_name)
        self.policy.train()  # from_pretrained returns eval mode; training wants dropout as configured
        self._frozen = [frozen_copy(self.policy)]

    def configure_optimizers(self) -> dict:
        optimizer = self.optimizer_factory(params=self.policy.parameters())
        # a linear lr ramp: Adam's first updates move every weight by ~lr whatever the gradient,
        # and early policy-gradient estimates are mostly noise
        ramp = max(self.lr_warmup_steps, 0) + 1
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / ramp))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def on_fit_start(self) -> None:
        self.reference.to(self.device)

    # -- one GRPO step ---------------------------------------------------------------------
    def training_step(self, batch: list[Prompt], batch_idx: int) -> dict[str, torch.Tensor]:
        s, G = self.rollout_settings, self.rollout_settings.group_size

        # 1. sample: one batched rollout of B x G rows, rewards, near-copy marks
        rounds = [self._sample_round(batch)]

        # 2. optionally leave out groups with no reward spread, refilling from the same bucket
        informative = rounds[0].informative  # [B]
        while s.filter.refill and int(informative.sum()) < len(batch) and len(rounds) <= s.filter.max_rounds:
            used = {p.id for r in rounds for p in r.prompts}
            extra = self.prompt_pool(batch[0].bucket, len(batch) - int(informative.sum()), self.global_step,
                                     len(rounds), used)
            if not extra:
                break
            rounds.append(self._sample_round(extra))
            informative = torch.cat([r.informative for r in rounds])
        sampled = merge_rounds(rounds, self.tokenizer.pad_token_id)
        keep = sampled.informative if s.filter.zero_std else torch.ones_like(sampled.informative)  # [N]
        valid = sampled.valid & keep[:, None]  # [N, G]
        groups = keep.nonzero().squeeze(1)  # the groups that enter the update
        B = len(groups)
        rows = (groups[:, None] * G + torch.arange(G, device=groups.device)).reshape(-1)  # [B*G]
        ro = sampled.rollout if B == len(keep) else select_rows(sampled.rollout, rows)

        # 3-5. reference and policy log-probs, group advantages, the clipped loss
        if B > 0:
            loss, stats, loss_tokens = self._loss(ro, sampled.rewards[groups], valid[groups])
        else:  # nothing informative: a zero loss that still touches every weight (DDP needs it)
            loss = 0.0 * sum(p.sum() for p in self.policy.parameters())
            stats = {"kl_mean": loss.detach(), "clip_frac": loss.detach()}
            loss_tokens = loss.detach()
        self.log("train/loss", loss.detach(), prog_bar=True)
        self.log("train/reward", sampled.rewards.mean(), prog_bar=True)
        self.log("train/clip_frac", stats["clip_frac"])
        for name, scores in sampled.parts.items():
            self.log(f"reward/{name}/mean", scores.mean())

        # 6. loss and plain tensors for the health callback: everything sampled, not only what trained
        return {
            "loss": loss,
            "rewards": sampled.rewards,  # [N, G] all sampled groups, refills included
            "distinct": sampled.distinct,  # [N, G] not a near-copy of an earlier row
            "valid": valid,  # [N, G] counted in loss and group statistics
            "temperatures": sampled.rollout.temperatures,  # [N*G] each row's sampling temperature
            "lengths": sampled.rollout.completion_mask.sum(dim=1),  # [N*G] generated tokens, EOS included
            "loss_tokens": loss_tokens,  # tokens that carry loss after every mask
            "kl_mean": stats["kl_mean"],
            "refill_rounds": torch.tensor(float(len(rounds) - 1), device=self.device),
            "refill_exhausted": torch.tensor(float(s.filter.refill and int(informative.sum()) < len(batch)),
                                             device=self.device),
        }

    def _loss(self, ro: Rollout, rewards: torch.Tensor, valid: torch.Tensor):
        B, G = rewards.shape
        T = ro.completion_mask.shape[1]
        a = self.loss_settings

        # 3. reference log-probs, no graph
        with torch.no_grad():
            ref_logps = self._logprobs(self.reference, ro)  # [B*G, T]

        # 4. policy log-probs with grad; one update per rollout, so the rollout policy is this one
        logps = self._logprobs(self.policy, ro)  # [B*G, T]
        old_logps = logps.detach()

        # 5. group advantages and the clipped loss
        advantages = group_advantages(rewards, valid, adv_clip=a.adv_clip)  # [B, G]
        mask = ro.completion_mask.view(B, G, T) * valid[..., None]  # [B, G, T]
        loss, stats = policy_loss(
            logps.view(B, G, T), ref_logps.view(B, G, T), old_logps.view(B, G, T), advantages, mask,
            beta=a.beta, clip_eps=a.clip_eps,
        )
        return loss, stats, mask.sum()

    def _sample_round(self, prompts: list[Prompt]) -> SampledGroups:
        """Roll out G rows for each prompt in one batched call; score and dedup them."""
        s, G = self.rollout_settings, self.rollout_settings.group_size
        temperatures = s.row_temperatures(len(prompts))  # [n*G] row g at temperature slot g
        ro = generate(self.policy, self.tokenizer, s.row_prompts(prompts), temperatures, s.top_p, s.max_new_tokens)
        completions = [ro.texts[b * G : (b + 1) * G] for b in range(len(prompts))]
        rewards, parts = score_completions(self.reward_functions, prompts, completions)  # [n, G]
        distinct = s.dedup(completions).to(self.device)  # [n, G]
        # near-copies, and whole groups with too few distinct rows, leave loss and statistics
        valid = distinct & s.dedup.groups_kept(distinct)[:, None]  # [n, G]
        rewards = rewards.to(self.device)
        return SampledGroups(prompts, ro, rewards, parts, distinct, valid, informative_groups(rewards, valid))

    def _logprobs(self, model: torch.nn.Module, ro: Rollout) -> torch.Tensor:
        return token_logprobs(model, ro.input_ids, ro.attention_mask, ro.prompt_len, ro.temperatures)

    # -- greedy held-out accuracy per bucket ------------------------------------------------
    def validation_step(self, batch: list[Prompt], batch_idx: int) -> None:
        greedy = torch.zeros(len(batch))
        ro = generate(self.policy, self.tokenizer, [p.prompt for p in batch], greedy, 1.0, self.eval_max_new_tokens)
        correct = torch.tensor([self.exact(p, text) for p, text in zip(batch, ro.texts)], device=self.device)
        bucket = batch[0].bucket
        self.val_correct[bucket].update(correct.sum())
        self.val_total[bucket].update(torch.tensor(float(len(batch)), device=self.device))

    def on_validation_epoch_end(self) -> None:
        accuracy = {}
        for bucket in BUCKETS:
            total = self.val_total[bucket].compute()  # syncs across ranks: every rank calls it
            correct = self.val_correct[bucket].compute()
            if total > 0:
                accuracy[f"eval/accuracy/{bucket}"] = (correct / total).item()
            self.val_total[bucket].reset()
            self.val_correct[bucket].reset()
        self.last_eval = accuracy
        # written straight to the loggers: self.log would stamp a mid-training evaluation with
        # step - 1, and the step-0 baseline must sit at step 0
        for logger in self.trainer.loggers:
            logger.log_metrics(accuracy, step=self.global_step)
        if self.trainer.is_global_zero:
            shown = "  ".join(f"{k.rsplit('/', 1)[1]} {a:.3f}" for k, a in accuracy.items())
            log.info("step %d  greedy held-out accuracy: %s", self.global_step, shown)
