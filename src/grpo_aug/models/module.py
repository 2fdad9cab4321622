"""The GRPO LightningModule. training_step reads as numbered steps, each a separately tested piece
(GroupSampler, loss_mask, group_advantages, Scorer, chunk_loss); the module owns the update loop
(chunked backwards; non-finite and empty updates skipped on every rank), logging and run state."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable

import lightning as L
import torch

from grpo_aug.algo import group_advantages
from grpo_aug.algo.advantages import batch_reward_std
from grpo_aug.algo.loss import merge_stats
from grpo_aug.algo.masks import TokenText, loss_mask
from grpo_aug.algo.optim import clip_gradients_, gradient_norm, lr_factor
from grpo_aug.algo.settings import AlgoSettings
from grpo_aug.data.datamodule import PaddingBatch
from grpo_aug.data.pass_rate import pass_rates
from grpo_aug.data.prompt_format import ChatPrompt, PlainPrompt
from grpo_aug.data.records import Prompt
from grpo_aug.distributed import rank_any, rank_max, rank_mean, rank_sum
from grpo_aug.lean.decode import sharded
from grpo_aug.models.evaluation import EvalSettings, HeldoutAccuracy, describe
from grpo_aug.models.loading import load_tokenizer
from grpo_aug.models.lora import Lora, NoLora
from grpo_aug.models.policy import PolicyModels
from grpo_aug.models.run_counts import RunCounts, RunStream
from grpo_aug.models.sharding import data_parallel_mesh, shard_fsdp2
from grpo_aug.models.step import PreparedStep, step_report, train_scalars
from grpo_aug.models.update import chunk_loss, zero_loss
from grpo_aug.resume import gather_per_rank
from grpo_aug.rewards import AnswerFormat, RewardSet
from grpo_aug.rewards.trl import TrainerState
from grpo_aug.rollout.engine import HFEngine, VLLMEngine
from grpo_aug.rollout.groups import GroupSampler, PromptPool, SampledGroups
from grpo_aug.rollout.likelihood import reference_logprobs
from grpo_aug.rollout.merge import select_rows
from grpo_aug.rollout.reflect import NoReflection, Reflection
from grpo_aug.rollout.selection import Picked, PromptSelection
from grpo_aug.rollout.settings import RolloutSettings
from grpo_aug.update.scoring import Scorer

log = logging.getLogger(__name__)


class GRPOModule(L.LightningModule):
    def __init__(
        self,
        name_or_path: str,
        optimizer: Callable[..., torch.optim.Optimizer],
        reward: RewardSet,
        rollout: RolloutSettings,
        algo: AlgoSettings,
        dtype: str = "float32",
        eval_max_new_tokens: int | None = None,
        lr_warmup_steps: int = 0,
        lr_final_ratio: float = 1.0,
        prompt_pool: PromptPool | None = None,
        seed: int = 0,
        selection: PromptSelection | None = None,
        answer: AnswerFormat | None = None,
        prompt_format: PlainPrompt | ChatPrompt | None = None,
        evaluation: EvalSettings | None = None,
        lora: Lora | NoLora | None = None,
        gradient_checkpointing: bool = False,
        engine: HFEngine | VLLMEngine | None = None,
        reflect: Reflection | NoReflection | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters("name_or_path", "dtype", "seed")  # the rest are objects, not hyperparameters
        # several optimizer steps per rollout (algo.num_iterations x algo.minibatches)
        self.automatic_optimization = False
        self.name_or_path = str(name_or_path)
        self.optimizer_factory = optimizer
        self.reward = reward
        self.rollout_settings = rollout
        self.algo = algo
        self.models = PolicyModels(self.name_or_path, dtype, lora, gradient_checkpointing, algo.lean,
                                   algo.needs_reference)
        # with an adapter, checkpoints hold the adapter alone; the base weights come from name_or_path
        self.strict_loading = not self.models.lora.active
        self.eval_max_new_tokens = eval_max_new_tokens or rollout.max_new_tokens
        self.lr_factor = functools.partial(lr_factor, warmup=lr_warmup_steps, final=lr_final_ratio)
        if rollout.filter.refill and prompt_pool is None:
            raise ValueError("rollout.filter.refill needs a prompt pool (the DataModule's draw_prompts)")
        self.tokenizer = load_tokenizer(self.name_or_path)  # fails now if the path is wrong
        self.token_text = TokenText(self.tokenizer)  # for the template masks
        self.prompt_format = (prompt_format or PlainPrompt()).bind(self.tokenizer, self.name_or_path)
        self.sampler = GroupSampler(self.tokenizer, reward, algo.overlong_buffer, algo.overlong_penalty, prompt_pool,
                                    self.prompt_format, engine, reflect)
        self.scorer = Scorer(algo.length_chunks, functools.partial(rank_mean, self), algo.micro_batch_rows,
                             functools.partial(rank_max, self))
        # which prompts to roll out; the per-prompt history
        self.selection = selection or PromptSelection(answer=answer)
        self.seed = seed
        # the rollout's own random stream: checkpointed, and untouched by anything else that draws
        # (dataloader workers, evaluation), so a resumed run samples what an uninterrupted one does
        self.stream = RunStream(seed)
        self.policy: torch.nn.Module | None = None
        self.counts = RunCounts()  # failed reward calls and skipped updates, this run
        self.logged_window = 0  # global_step // trainer.log_every_n_steps at the last train/* write
        self.last_eval: dict[str, float] = {}
        self.val_accuracy = HeldoutAccuracy(answer, evaluation)

    def configure_model(self) -> None:
        if self.policy is not None:  # Lightning may call this more than once
            return
        self.policy = self.models.load()
        mesh = data_parallel_mesh(self.trainer.strategy) if self._trainer is not None else None
        if mesh is not None:  # trainer=fsdp: FSDP2 over the data-parallel ranks, before the optimizer exists
            shard_fsdp2(self.policy, mesh)
        self.sampler.engine.setup(self.name_or_path, self.tokenizer, self.seed)

    def pass_rates(self, records: list[Prompt], samples: int, temperature: float, max_new_tokens: int,
                   seed: int) -> list[float]:
        """Each record's share of `samples` completions the starting policy gets right (before
        training: data.source.tiers=pass_rate), on the GPU when there is one."""
        self.configure_model()
        device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")
        self.policy.to(device)
        rates = pass_rates(self.sampler.engine, self.policy, self.tokenizer, self.prompt_format,
                           self.val_accuracy.exact, records, samples, temperature, max_new_tokens, seed=seed)
        self.policy.to("cpu")  # Lightning places it
        return rates

    @property
    def temperature_ladder(self) -> tuple[float, ...]:
        return self.rollout_settings.temperatures

    def set_temperature_ladder(self, ladder) -> None:
        """The adaptive temperature controller's new ladder, from the next rollout on."""
        self.rollout_settings = dataclasses.replace(self.rollout_settings, temperatures=tuple(ladder))

    def configure_optimizers(self) -> dict:
        optimizer = self.optimizer_factory(params=[p for p in self.policy.parameters() if p.requires_grad])
        total = self.trainer.max_steps if self._trainer is not None else 0
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(self.lr_factor, total=total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def transfer_batch_to_device(self, batch: list[Prompt], device, dataloader_idx: int) -> list[Prompt]:
        return batch  # prompt records are text; the rollout tokenises them on the model's device

    def on_fit_start(self) -> None:
        self.models.place(self.device, self.trainer.strategy)
        if sharded(self.policy) and self.sampler.reflect.active:
            raise ValueError("rollout/reflect=hint re-samples on some ranks only; it cannot run under sharded "
                             "weights (trainer=fsdp|deepspeed): use rollout/reflect=none there")
        self._vote_if_sharded()

    def on_validation_start(self) -> None:
        self._vote_if_sharded()  # the step-0 baseline and mode=eval run before (or without) fit

    def _vote_if_sharded(self) -> None:
        """Under sharded weights every forward is a collective: ranks decide decode steps and refill
        rounds together."""
        self.sampler.any_rank = functools.partial(rank_any, self) if sharded(self.policy) else None

    @property
    def generator(self) -> torch.Generator:
        rank = self.global_rank if self._trainer is not None else 0
        return self.stream.get(next(self.policy.parameters()).device, rank)

    def on_train_start(self) -> None:
        self.logged_window = self.global_step // self.trainer.log_every_n_steps
        self.stream.restore(next(self.policy.parameters()).device, self.global_rank)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["state_dict"] = self.models.saved(checkpoint.get("state_dict", {}))
        checkpoint["beta_schedule"] = self.algo.beta.state_dict()
        checkpoint["run_state"] = {
            "rng": self.stream.state(next(self.policy.parameters()).device, self.global_rank),
            **self.counts.state_dict(),
            "selection": self.selection.state_dict(),  # the same on every rank
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.models.check_loadable(checkpoint.get("state_dict", {}))
        self.algo.beta.load_state_dict(checkpoint.get("beta_schedule", {}))
        state = checkpoint.get("run_state")
        if state is not None:
            self.counts.load_state_dict(state)
            if "selection" in state:
                self.selection.load_state_dict(state["selection"])
            self.stream.restored = state["rng"]

    # -- one GRPO step: a rollout, then algo.num_iterations x algo.minibatches updates ----------
    def training_step(self, batch: list[Prompt], batch_idx: int) -> dict:
        a = self.algo
        # 1-5. rollout, filters, masks, advantages, reference (and old) log-probs
        step = self.prepare(batch)

        # 6. the clipped-loss updates over minibatches of whole groups
        beta = a.beta(self.global_step)
        parts = torch.tensor_split(torch.arange(len(step.groups)), a.minibatches)
        stats = [self._update(step, beta, part, entropy=(i == 0 and j == 0))
                 for i in range(a.num_iterations) for j, part in enumerate(parts)]

        # 7. logs, the beta schedule's view of the KL, the report for the callbacks
        updates = {k: torch.stack([st[k] for st in stats]) for k in stats[0]}  # [U] each
        kl_mean = self.trainer.strategy.reduce(updates["kl_mean"][: a.minibatches].mean(), reduce_op="mean")
        a.beta.observe(self.global_step, kl_mean.item())
        self._log_step(step, updates, beta)
        self.counts.stop_if_stuck(a.max_consecutive_nonfinite, self.global_step,
                                  getattr(self.trainer.checkpoint_callback, "last_model_path", "") or "")
        return {"report": step_report(step, updates, kl_mean, self.rollout_settings.group_size,
                                         self.rollout_settings.temperatures), "updates": updates}

    def _reference_logprobs(self, prompts: list[Prompt]) -> list[float]:
        """log p(reference solution | prompt) under the policy now, for the selector."""
        texts = self.prompt_format([p.prompt for p in prompts], [p.context for p in prompts])
        return reference_logprobs(self.policy, self.tokenizer, texts, [p.solution for p in prompts],
                                  self.rollout_settings.max_new_tokens)

    def sample_groups(self, batch: list[Prompt], rollout_step: int, step: int) -> tuple[Picked, SampledGroups]:
        """The prompts the feed picks from the batch, their groups rolled out and scored (refill
        rounds included), and the feed's view of them; no update. `rollout_step` counts rollouts
        (the data sampler's step), `step` optimizer steps. Preflight calls it alone."""
        s = self.rollout_settings
        picked = self.selection.pick(batch, rollout_step, self._reference_logprobs)
        self.sampler.engine.sync(self.policy, step)  # an external engine samples from these weights
        state = TrainerState(step, self.trainer.max_steps if self._trainer is not None else 0)
        sampled = self.sampler.sample(self.policy, picked.prompts, s, step, self.generator, state)
        # every rank's outcomes update the history, the selector and the online buckets alike
        self.selection.observe(picked, sampled, rollout_step, s.rows_per_prompt, gather_per_rank)
        return picked, sampled

    def prepare(self, batch: list[Prompt]) -> PreparedStep:
        """Everything an update needs, computed once per rollout; no optimizer involved."""
        s, G, a = self.rollout_settings, self.rollout_settings.group_size, self.algo

        # 1. choose the prompts: the selector skips those likely to give a flat group (replaced
        # from the same bucket); 2. sample G rows each in one batched rollout (oversampled and
        # down-sampled to the max-variance G if configured), score and dedup them; with the
        # zero-std filter, refill rounds of fresh prompts while too few groups have spread
        picked, sampled = self.sample_groups(batch, self.global_step // a.updates_per_rollout, self.global_step)
        keep = sampled.informative if s.filter.zero_std else torch.ones_like(sampled.informative)  # [N]
        valid = sampled.valid & keep[:, None]  # [N, G]
        groups = keep.nonzero().squeeze(1)  # [B] the groups that enter the update
        rows = (groups[:, None] * G + torch.arange(G, device=groups.device)).reshape(-1)  # [B*G]
        ro = sampled.rollout if len(groups) == len(keep) else select_rows(sampled.rollout, rows)

        # 3. which tokens carry loss: padding, truncation, scaffolding, repeats, left-out rows
        mask = loss_mask(ro.input_ids[:, ro.prompt_len :], ro.completion_mask, ro.truncated, valid[groups],
                         a.mask_truncated, a.compiled_templates, a.repeat_ngram, a.repeat_max,
                         self.token_text)  # [B*G, T]

        # 4. advantages from the step's (optionally winsorised) rewards, within each group
        rewards = self.reward.winsorize(sampled.rewards[groups], valid[groups])  # [B, G]
        batch_std = None
        if a.scale_rewards.needs_batch_std:  # every counted reward of the step, flat groups and all ranks included
            batch_std = batch_reward_std(self.reward.winsorize(sampled.rewards, sampled.valid), sampled.valid,
                                         functools.partial(rank_sum, self))
        advantages = group_advantages(rewards, valid[groups], adv_clip=a.adv_clip, scale=a.scale_rewards,
                                      batch_std=batch_std).reshape(-1)  # [B*G]

        # 5. reference log-probs, and the rollout policy's when it changes before the last update
        ref_logps = old_logps = None
        if len(groups) > 0:
            chunks = self.scorer.chunks(self.policy, ro.completion_mask.sum(dim=1), ro.prompt_len)
            with torch.no_grad():
                if a.needs_reference:
                    with self.models.reference() as reference:
                        ref_logps = self.scorer.logprobs(reference, ro, chunks)  # [B*G, T]
                if a.updates_per_rollout > 1:
                    old_logps = self.scorer.logprobs(self.policy, ro, chunks)  # [B*G, T]
        exhausted = s.filter.refill and int(sampled.informative.sum()) < len(picked.prompts)
        hinted = None if sampled.hinted is None else sampled.hinted[groups].reshape(-1)  # [B*G]
        engine_sampled = (self.sampler.engine.external and a.engine_correction.active
                          and ro.sample_logprobs is not None)
        return PreparedStep(sampled, groups, valid, ro, mask, advantages, ref_logps, old_logps, exhausted, hinted,
                            engine_sampled)

    def _update(self, step: PreparedStep, beta: float, groups: torch.Tensor, entropy: bool) -> dict[str, torch.Tensor]:
        """One optimizer step on `groups` (indices into the step's groups); returns detached stats.

        Length-sorted chunks each run their own backward; their losses add up to the update's.
        A non-finite chunk loss or gradient norm on any rank skips the update on every rank (no
        optimizer or lr step: weights and AdamW's moments stay bit-identical; counted in
        `train/skipped_nonfinite`); so does an update without a loss token on any rank (a zero
        gradient would still move every weight through AdamW's momentum), uncounted.
        """
        a, G, ro = self.algo, self.rollout_settings.group_size, step.rollout
        optimizer, schedule = self.optimizers(), self.lr_schedulers()
        optimizer.zero_grad()
        rows = (groups[:, None] * G + torch.arange(G)).reshape(-1).to(ro.input_ids.device)  # [b*G]
        total_tokens = step.mask[rows].sum()
        aggregate = functools.partial(a.loss.part, rows=len(rows), tokens=total_tokens)
        parts, nonfinite = [], 0
        for chunk in self.scorer.chunks(self.policy, ro.completion_mask[rows].sum(dim=1), ro.prompt_len):
            if len(chunk) == 0 and sharded(self.policy) and len(rows) > 0:
                # fewer rows here than another rank's parts: under sharded weights every forward is a
                # collective, so a stand-in row runs one, weighted 0
                loss, stats = 0.0 * chunk_loss(self.policy, self.scorer, a, step, rows[:1], beta, aggregate)[0], None
            elif len(chunk) == 0:  # fewer rows than chunks
                loss, stats = zero_loss(self.policy), None
            else:
                loss, stats = chunk_loss(self.policy, self.scorer, a, step, rows[chunk], beta, aggregate, entropy)
            if not torch.isfinite(loss):
                nonfinite += 1
                # the backward still runs (on a zero loss) so that DDP ranks stay in lockstep
                loss, stats = zero_loss(self.policy), None
            self.manual_backward(loss)
            parts.append((loss.detach(), stats))
        grad_norm = gradient_norm(self.policy)
        finite = bool(torch.isfinite(grad_norm))
        local = torch.tensor([float(nonfinite > 0 or not finite), float(total_tokens),
                              float(grad_norm) ** 2 if finite else 0.0], device=self.device)
        # one reduce, every rank; the squared norms add up to the whole model's only when sharded
        bad, tokens, norm_sq = self.trainer.strategy.reduce(local, reduce_op="sum").tolist()
        skip, empty = bad > 0, tokens == 0
        if skip:
            log.warning("step %d: non-finite %s; the update is skipped on every rank (weights unchanged)",
                        self.global_step,
                        f"loss in {nonfinite} chunk(s)" if nonfinite else f"gradient norm {grad_norm}")
        if skip or empty:
            optimizer.zero_grad(set_to_none=True)
            optimizer.step()  # counts the step; with no gradient the optimizer touches nothing
        else:
            if a.max_grad_norm is not None:  # by hand: Lightning refuses to clip fused optimizers under bf16-mixed
                clip_gradients_(self.policy, a.max_grad_norm, norm_sq ** 0.5 if sharded(self.policy) else None)
            optimizer.step()
            schedule.step()
        self.counts.add_update(skip)
        return {"loss": sum(loss for loss, _ in parts), "nonfinite": torch.tensor(float(nonfinite), device=self.device),
                "skipped": torch.tensor(float(skip), device=self.device),
                **merge_stats([st for _, st in parts if st is not None], self.device)}

    def _log_step(self, step: PreparedStep, summary: dict[str, torch.Tensor], beta: float) -> None:
        sampled = step.sampled
        c = self.counts
        c.add_rewards(sampled.parts, sampled.errors, sampled.timeouts)
        values = train_scalars(step, summary, beta, c.skipped_total, c.reward_errors,
                               c.reward_timeouts if self.reward.timed is not None else None,
                               self.rollout_settings.oversample > 1, self.algo.clip_ratio_c is not None)
        self.log_dict({k: values[k] for k in ("train/loss", "train/reward")}, prog_bar=True, logger=False)
        # written straight to the loggers at the optimizer step: with several updates per rollout,
        # Lightning's own logging step would count rollouts, not the steps every other curve uses
        window = self.global_step // self.trainer.log_every_n_steps
        if window > self.logged_window:
            self.logged_window = window
            scalars = {k: float(v) for k, v in values.items()}
            scalars.update(self.selection.window_metrics())  # since the last write, every rank's groups
            scalars.update({f"curriculum/moved/{k}": float(v) for k, v in self.selection.history.moved.items()})
            for logger in self.trainer.loggers:
                logger.log_metrics(scalars, step=self.global_step)

    # -- held-out evaluation per bucket (models/evaluation.py) -------------------------------
    def validation_step(self, batch: list[Prompt], batch_idx: int) -> None:
        rank = self.global_rank if self._trainer is not None else 0
        seed = ((self.seed * 1_000_003 + self.global_step) * 10_007 + batch_idx) * 1_009 + rank
        padding = isinstance(batch, PaddingBatch)  # evens out the ranks' batch counts, never counted
        if padding and self.sampler.any_rank is None:
            return  # unsharded ranks need not join each other's forwards
        engine = self.sampler.engine
        engine.sync(self.policy, self.global_step)  # an external engine evaluates the weights trained so far
        texts = self.prompt_format([p.prompt for p in batch], [p.context for p in batch])
        self.val_accuracy.evaluate(engine, self.policy, self.tokenizer, texts, batch, self.eval_max_new_tokens, seed,
                                   self.device, self.sampler.all_done(), counted=not padding,
                                   knobs=self.rollout_settings.knobs)

    def on_validation_epoch_end(self) -> None:
        self.last_eval = accuracy = self.val_accuracy.compute()
        # written straight to the loggers: self.log would stamp a mid-training evaluation with
        # step - 1, and the step-0 baseline must sit at step 0
        for logger in self.trainer.loggers:
            logger.log_metrics(accuracy, step=self.global_step)
        if self.trainer.is_global_zero:
            log.info("step %d  %s", self.global_step, describe(accuracy))
