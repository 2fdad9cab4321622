"""The GRPO LightningModule: rollout, reward, group advantage and clipped loss in training_step."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import lightning as L
import torch
from torchmetrics.aggregation import SumMetric

from grpo_aug.algo import group_advantages, policy_loss, token_logprobs
from grpo_aug.algo.settings import LossSettings
from grpo_aug.data.records import BUCKETS, Prompt
from grpo_aug.models.loading import frozen_copy, load_policy, load_tokenizer
from grpo_aug.rewards import MathReward, RewardFunction, score_completions
from grpo_aug.rollout import Rollout, generate
from grpo_aug.rollout.settings import RolloutSettings

log = logging.getLogger(__name__)


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
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer", "rewards", "rollout", "algo"])
        self.name_or_path = str(name_or_path)
        self.optimizer_factory = optimizer
        self.reward_functions = list(rewards)
        self.rollout_settings = rollout
        self.loss_settings = algo
        self.dtype_name = dtype
        self.eval_max_new_tokens = eval_max_new_tokens or rollout.max_new_tokens
        self.lr_warmup_steps = lr_warmup_steps
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
        B, G = len(batch), self.rollout_settings.group_size
        s, a = self.rollout_settings, self.loss_settings

        # 1. G rows per prompt, row g at temperature slot g (and hint slot g, if hints are set)
        temperatures = s.row_temperatures(B)  # [B*G]
        rows = s.row_prompts(batch)

        # 2. one batched rollout for all B*G rows
        ro = generate(self.policy, self.tokenizer, rows, temperatures, s.top_p, s.max_new_tokens)
        T = ro.completion_mask.shape[1]

        # 3. reference log-probs, no graph
        with torch.no_grad():
            ref_logps = self._logprobs(self.reference, ro)  # [B*G, T]

        # 4. rewards per completion
        completions = [ro.texts[b * G : (b + 1) * G] for b in range(B)]
        rewards, parts = score_completions(self.reward_functions, batch, completions)  # [B, G]
        rewards = rewards.to(self.device)

        # 5. near-copies, and whole groups with too few distinct rows, leave loss and statistics
        distinct = s.dedup(completions).to(self.device)  # [B, G]
        valid = distinct & s.dedup.groups_kept(distinct)[:, None]  # [B, G]

        # 6. policy log-probs with grad; one update per rollout, so the rollout policy is this one
        logps = self._logprobs(self.policy, ro)  # [B*G, T]
        old_logps = logps.detach()

        # 7. group advantages and the clipped loss
        advantages = group_advantages(rewards, valid, adv_clip=a.adv_clip)  # [B, G]
        mask = ro.completion_mask.view(B, G, T) * valid[..., None]  # [B, G, T]
        loss, stats = policy_loss(
            logps.view(B, G, T), ref_logps.view(B, G, T), old_logps.view(B, G, T), advantages, mask,
            beta=a.beta, clip_eps=a.clip_eps,
        )
        self.log("train/loss", loss.detach(), prog_bar=True)
        self.log("train/reward", rewards.mean(), prog_bar=True)
        self.log("train/clip_frac", stats["clip_frac"])
        for name, scores in parts.items():
            self.log(f"reward/{name}/mean", scores.mean())

        # 8. loss and plain tensors for the health callback
        return {
            "loss": loss,
            "rewards": rewards.detach(),  # [B, G]
            "distinct": distinct,  # [B, G] not a near-copy of an earlier row
            "valid": valid,  # [B, G] counted in loss and group statistics
            "temperatures": ro.temperatures,  # [B*G] each row's sampling temperature
            "lengths": ro.completion_mask.sum(dim=1),  # [B*G] generated tokens per row, EOS included
            "loss_tokens": mask.sum(),  # tokens that carry loss after every mask
            "kl_mean": stats["kl_mean"],
        }

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
