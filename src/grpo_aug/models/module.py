"""The GRPO LightningModule: a policy and the three stages of a step, each its own object with its
own settings and state.

    feed (prompts/)     which prompts the step rolls out; learns from what their groups showed
    rollout (rollout/)  G rows per prompt, sampled, scored and deduplicated (refill, down-sampling)
    update (update/)    masks, advantages, reference log-probs, the clipped-loss optimizer steps

training_step reads feed -> rollout -> observe -> update; the module lends the stages its policy,
its optimizer and its rank reductions, and owns logging and the run's checkpointed state.
"""

from __future__ import annotations

import logging
import os

import lightning as L
import torch

from grpo_aug.data.records import Prompt
from grpo_aug.distributed import Ranks
from grpo_aug.errors import UsageError
from grpo_aug.fast_llama.decode import sharded
from grpo_aug.models.evaluation import HeldoutAccuracy, describe
from grpo_aug.models.group_sources import SampleAhead, SampleNow
from grpo_aug.models.loading import load_tokenizer
from grpo_aug.models.optimization import Optimization
from grpo_aug.models.policy import PolicyModels
from grpo_aug.models.run_counts import RunCounts
from grpo_aug.models.sharding import data_parallel_mesh, shard_fsdp2
from grpo_aug.prompts import PromptFeed
from grpo_aug.prompts.datamodule import PaddingBatch
from grpo_aug.prompts.pass_rate import pass_rates
from grpo_aug.rewards.trl import TrainerState
from grpo_aug.rollout.groups import GroupRollout
from grpo_aug.step_clock import StepClock
from grpo_aug.step_types import Picked, PreparedStep, SampledGroups, UpdateStats
from grpo_aug.update.policy_update import OptimizerHandle, PolicyUpdate
from grpo_aug.update.step import step_report, train_scalars

log = logging.getLogger(__name__)


class GRPOModule(L.LightningModule):
    def __init__(self, policy: PolicyModels, feed: PromptFeed, rollout: GroupRollout, update: PolicyUpdate,
                 optimization: Optimization, evaluation: HeldoutAccuracy | None = None) -> None:
        super().__init__()
        self.save_hyperparameters({"name_or_path": policy.name_or_path, "dtype": policy.dtype, "seed": rollout.seed})
        # several optimizer steps per rollout (algo.num_iterations x algo.minibatches)
        self.automatic_optimization = False
        self.models, self.feed, self.rollout, self.update = policy, feed, rollout, update
        self.optimization = optimization
        self.name_or_path = policy.name_or_path
        # the update decides what the policy must provide: a frozen reference only when beta is
        # ever > 0, the lean forward unless algo.fast_llama=false
        self.models.keep_reference = update.algo.needs_reference
        self.models.lean = update.algo.fast_llama
        # with an adapter, checkpoints hold the adapter alone; the base weights come from name_or_path
        self.strict_loading = not self.models.lora.active
        self.tokenizer = load_tokenizer(self.name_or_path)  # fails now if the path is wrong
        self.ranks = Ranks(self)
        self.rollout.bind(self.tokenizer, self.name_or_path)
        self.feed.bind(self.tokenizer, self.rollout.prompt_format, self.rollout.settings.max_new_tokens, self.ranks)
        self.update.bind(self.tokenizer, self.ranks)
        self.policy: torch.nn.Module | None = None
        self.counts = RunCounts()  # failed reward calls and skipped updates, this run
        self.logged_window = 0  # global_step // trainer.log_every_n_steps at the last train/* write
        self.last_eval: dict[str, float] = {}
        self.val_accuracy = evaluation or HeldoutAccuracy()
        # where the step's groups come from (models/group_sources.py): sampled now, or with
        # rollout.ahead >= 1 queued k steps ago (built at train start; a checkpoint's queued batches
        # are sampled again then)
        self.source: SampleNow | SampleAhead = SampleNow(self)
        self.restored_queue: list[dict] = []
        self.clock = StepClock(sync=self._sync_device)  # the step's seconds per phase: time/*_s

    @property
    def algo(self):
        return self.update.algo

    def configure_model(self) -> None:
        if self.policy is not None:  # Lightning may call this more than once
            return
        self.policy = self.models.load()
        mesh = data_parallel_mesh(self.trainer.strategy) if self._trainer is not None else None
        if mesh is not None:  # trainer=fsdp: FSDP2 over the data-parallel ranks, before the optimizer exists
            shard_fsdp2(self.policy, mesh)
        self.rollout.engine.setup(self.name_or_path, self.tokenizer, self.rollout.seed)

    def pass_rates(self, records: list[Prompt], samples: int, temperature: float, max_new_tokens: int,
                   seed: int) -> list[float]:
        """Each record's share of `samples` completions the starting policy gets right (before
        training: data.source.tiers=pass_rate), on the GPU when there is one."""
        self.configure_model()
        device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")
        self.policy.to(device)
        rates = pass_rates(self.rollout.engine, self.policy, self.tokenizer, self.rollout.prompt_format,
                           self.val_accuracy.exact, records, samples, temperature, max_new_tokens, seed=seed)
        self.policy.to("cpu")  # Lightning places it
        return rates

    def configure_optimizers(self) -> dict:
        total = self.trainer.max_steps if self._trainer is not None else 0
        return self.optimization.build((p for p in self.policy.parameters() if p.requires_grad), total)

    def on_fit_start(self) -> None:
        self.models.place(self.device, self.trainer.strategy)
        self._vote_across_ranks()
        if self.rollout.any_rank is not None and self.rollout.reflect.active:
            raise UsageError("rollout/reflect (hint or prefix) re-samples on some ranks only; it cannot run under "
                             "sharded weights (trainer=fsdp|deepspeed) or with a vLLM engine on several ranks: use "
                             "rollout/reflect=none there")

    def on_validation_start(self) -> None:
        self._vote_across_ranks()  # the step-0 baseline and mode=eval run before (or without) fit

    def _vote_across_ranks(self) -> None:
        """Under sharded weights every forward is a collective, and with an engine on every rank
        (vLLM's external launcher) the engines share one world: ranks decide decode steps, refill
        rounds and held-out padding batches together, so each makes the same calls. A vLLM server
        answers each rank's requests on their own: nothing to decide together."""
        engine = self.rollout.engine
        together = getattr(engine, "shares_world", True) and (sharded(self.policy) or
                                                              (engine.external and self.ranks.world > 1))
        self.rollout.any_rank = self.ranks.any if together else None

    @property
    def generator(self) -> torch.Generator:
        rank = self.global_rank if self._trainer is not None else 0
        return self.rollout.generator(next(self.policy.parameters()).device, rank)

    def on_train_start(self) -> None:
        self.logged_window = self.global_step // self.trainer.log_every_n_steps
        self.rollout.restore(next(self.policy.parameters()).device, self.global_rank)
        if self.rollout.settings.ahead:
            self.source = SampleAhead(self, self.rollout.settings.ahead, self.restored_queue)
            self.restored_queue = []

    def on_train_end(self) -> None:
        self.source.close()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["state_dict"] = self.models.saved(checkpoint.get("state_dict", {}))
        checkpoint["run_state"] = {
            **self.counts.state_dict(),
            "rollout": self.rollout.state_dict(next(self.policy.parameters()).device, self.global_rank),
            "feed": self.feed.state_dict(),  # the same on every rank
            "update": self.update.state_dict(),
            "ahead": self.source.pending(),
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.models.check_loadable(checkpoint.get("state_dict", {}))
        state = checkpoint.get("run_state")
        if state is not None:
            self.counts.load_state_dict(state)
            self.feed.load_state_dict(state["feed"])
            self.update.load_state_dict(state["update"])
            self.rollout.load_state_dict(state["rollout"])
            self.restored_queue = list(state.get("ahead", []))

    # -- one GRPO step: a rollout, then algo.num_iterations x algo.minibatches updates ----------
    def training_step(self, batches: list[list[Prompt]], batch_idx: int) -> dict:
        """`batches`: the batches of the data steps this call starts (one; the first call of a run
        with rollout.ahead=k gets k + 1)."""
        self.clock.start()
        # 1-2. the groups to train on from the source: picked and sampled now, or queued
        # rollout.ahead steps ago; the feed has learnt from them (history, selector, curriculum)
        # before any weight moves
        groups = self.source.groups(batches)
        self.clock.lap("rollout")

        # 3. masks, advantages, reference (and old) log-probs: once per rollout
        step = self.prepare(groups.sampled)
        self.clock.lap("reference")

        # 4. the clipped-loss updates over minibatches of whole groups
        handle = OptimizerHandle(self.optimizers(), self.lr_schedulers(), self.manual_backward, self.global_step)
        updates, kl_mean, beta = self.update.train(self.policy, step, handle)

        # 5. the weights moved: a sampler ahead of training takes them
        self.source.weights_moved()
        self.clock.lap("update")

        # 6. logs, and the report the callbacks read
        return self.finish_step(step, updates, kl_mean, beta, groups.curriculum, groups.extra, self.clock.take())

    def finish_step(self, step: PreparedStep, updates: UpdateStats, kl_mean: torch.Tensor, beta: float,
                    curriculum: dict[str, float], extra: dict[str, float], seconds: dict[str, float]) -> dict:
        """seconds: the step's wall time per phase (grpo_aug/step_clock.py); RunRecord totals it."""
        for skipped in updates.skipped.tolist():
            self.counts.add_update(bool(skipped))
        self._log_step(step, updates, beta, curriculum, extra | {f"time/{k}_s": v for k, v in seconds.items()})
        self.counts.stop_if_stuck(self.algo.max_consecutive_nonfinite, self.global_step,
                                  getattr(self.trainer.checkpoint_callback, "last_model_path", "") or "")
        return {"report": step_report(step, updates, kl_mean, self.rollout.settings.temperatures), "updates": updates,
                "seconds": seconds}

    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def with_rows(self, picked: Picked) -> Picked:
        """The picked prompts with their rows each (rollout/budget: shared out by predicted pass
        rate from the feed's history, unless they already have them: a checkpoint's queued pick);
        without a budget, group_size each (rows None)."""
        s = self.rollout.settings
        if not s.budget.active or picked.rows is not None:
            return picked
        return picked._replace(rows=s.budget.rows(self.feed.history.predicted_pass(picked.prompts, s.budget.prior),
                                                  s.group_size))

    def sample_groups(self, batch: list[Prompt], rollout_step: int, step: int
                      ) -> tuple[Picked, SampledGroups, dict[str, float]]:
        """The prompts the feed picks from the batch, their groups rolled out and scored (refill
        rounds included), and the feed's view of them (its curriculum/* values); no update.
        `rollout_step` counts rollouts (the data sampler's step), `step` optimizer steps.
        Preflight calls it alone."""
        picked = self.with_rows(self.feed.pick(batch, rollout_step, self.policy))
        self.rollout.engine.sync(self.policy, step)  # an external engine samples from these weights
        state = TrainerState(step, self.trainer.max_steps if self._trainer is not None else 0)
        s = self.rollout.settings
        sampled = self.rollout.sample(self.policy, picked.prompts, step, self.generator, state, picked.rows)
        curriculum = self.feed.observe(picked, sampled, rollout_step, s.rows_per_prompt)
        return picked, sampled, curriculum

    def prepare(self, sampled: SampledGroups) -> PreparedStep:
        """What the updates need from the step's groups."""
        return self.update.prepare(self.policy, sampled, self.models.reference)

    def _log_step(self, step: PreparedStep, summary: UpdateStats, beta: float,
                  curriculum: dict[str, float], extra: dict[str, float] | None = None) -> None:
        sampled = step.sampled
        c = self.counts
        c.add_rewards(sampled.parts, sampled.errors, sampled.timeouts)
        values = train_scalars(step, summary, beta, c.skipped_total, c.reward_errors,
                               c.reward_timeouts if self.rollout.reward.timed is not None else None,
                               self.rollout.settings.oversample > 1, self.algo.clip_ratio_c is not None,
                               self.algo.top_entropy_quantile < 1)
        self.log_dict({k: values[k] for k in ("train/loss", "train/reward")}, prog_bar=True, logger=False)
        # written straight to the loggers at the optimizer step: with several updates per rollout,
        # Lightning's own logging step would count rollouts, not the steps every other curve uses
        window = self.global_step // self.trainer.log_every_n_steps
        if window > self.logged_window:
            self.logged_window = window
            scalars = {k: float(v) for k, v in values.items()} | (extra or {})
            scalars.update(self.feed.window_metrics())  # since the last write, every rank's groups
            for logger in self.trainer.loggers:
                logger.log_metrics(scalars, step=self.global_step)
        if curriculum:  # every step: which bucket it drew, the schedule's weights
            for logger in self.trainer.loggers:
                logger.log_metrics(curriculum, step=self.global_step)

    # -- held-out evaluation per bucket (models/evaluation.py) -------------------------------
    def validation_step(self, batch: list[Prompt], batch_idx: int) -> None:
        rank = self.global_rank if self._trainer is not None else 0
        seed = ((self.rollout.seed * 1_000_003 + self.global_step) * 10_007 + batch_idx) * 1_009 + rank
        padding = isinstance(batch, PaddingBatch)  # evens out the ranks' batch counts, never counted
        if padding and self.rollout.any_rank is None:
            return  # unsharded ranks need not join each other's forwards
        engine, s = self.rollout.engine, self.rollout.settings
        engine.sync(self.policy, self.global_step)  # an external engine evaluates the weights trained so far
        texts = self.rollout.prompt_format([p.prompt for p in batch], [p.context for p in batch])
        self.val_accuracy.evaluate(engine, self.policy, self.tokenizer, texts, batch,
                                   self.val_accuracy.max_new_tokens or s.max_new_tokens, seed, self.device,
                                   self.rollout.all_done(), counted=not padding, options=s.options)

    def on_validation_epoch_end(self) -> None:
        self.last_eval = accuracy = self.val_accuracy.compute()
        # written straight to the loggers: self.log would stamp a mid-training evaluation with
        # step - 1, and the step-0 baseline must sit at step 0
        for logger in self.trainer.loggers:
            logger.log_metrics(accuracy, step=self.global_step)
        if self.trainer.is_global_zero:
            log.info("step %d  %s", self.global_step, describe(accuracy))
