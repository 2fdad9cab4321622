"""Where a training step's groups come from (`rollout.ahead`). The step asks its source for the
groups of the data steps it was handed, trains on them, and tells the source its weights moved:

    SampleNow     rollout.ahead=0: the batch is picked, sampled and scored now, from the policy
                  as it is; nothing happens once the weights move.
    SampleAhead   rollout.ahead=k: each batch's rollout is queued on one worker thread
                  (update/ahead.py) and trained k steps later; the step trains on the oldest
                  queued rollout, then waits for the worker and gives the sampler the new weights.

The first call of a run with k >= 1 is handed the batches of data steps 0..k (prompts/datamodule.py,
`StepBatches`), so every call trains: there is no call that only fills the queue.
Either way the feed observes a rollout's groups just before they train.
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_aug.data.records import Prompt
from grpo_aug.rewards.trl import TrainerState
from grpo_aug.step_types import Picked, SampledGroups
from grpo_aug.update.ahead import AheadQueue, PolicyCopy, pending_picked


class Groups(NamedTuple):
    sampled: SampledGroups
    curriculum: dict[str, float]  # the feed's view of them (curriculum/*)
    extra: dict[str, float]  # the source's own scalars (rollout/staleness, ...)


class SampleNow:
    """rollout.ahead=0: the step's own batch, sampled from the policy as it is. `module`: the
    GRPOModule whose step asks (its feed, rollout, policy and step counters)."""

    def __init__(self, module) -> None:
        self.module = module

    def groups(self, batches: list[list[Prompt]]) -> Groups:
        (batch,) = batches
        m = self.module
        rollout_step = m.global_step // m.algo.updates_per_rollout
        _, sampled, curriculum = m.sample_groups(batch, rollout_step, m.global_step)
        return Groups(sampled, curriculum, {})

    def weights_moved(self) -> None:
        pass

    def pending(self) -> list[dict]:
        return []

    def close(self) -> None:
        pass


class SampleAhead:
    """rollout.ahead=k: rollouts queued on a worker, each trained k steps after its weights."""

    def __init__(self, module, depth: int, restored: list[dict]) -> None:
        self.module = module
        self.queue = AheadQueue(depth)
        # the hf engine samples from a copy of the policy; an external engine is its own sampler
        self.copy = None if module.rollout.engine.external else PolicyCopy(module.policy)
        module.rollout.engine.sync(module.policy, module.global_step)  # an external sampler starts from these weights
        for entry in restored:  # a checkpoint's queue, sampled again from the checkpoint's weights
            picked, rollout_step = pending_picked(entry)
            self.submit(picked, rollout_step)

    @property
    def model(self):
        """What the worker samples from: the copy, or the policy for an external engine."""
        return self.copy.model if self.copy is not None else self.module.policy

    def submit(self, picked: Picked, rollout_step: int) -> None:
        """Queue the rollout of `picked` on the worker; what it needs from this thread is read now."""
        m = self.module
        step = m.global_step
        state = TrainerState(step, m.trainer.max_steps if m._trainer is not None else 0)
        picked = m.with_rows(picked)
        model, generator = self.model, m.generator

        def sample() -> SampledGroups:
            return m.rollout.sample(model, picked.prompts, step, generator, state, picked.rows)

        self.queue.submit(picked, rollout_step, step // m.algo.updates_per_rollout, sample)

    def groups(self, batches: list[list[Prompt]]) -> Groups:
        m, queue = self.module, self.queue
        U = m.algo.updates_per_rollout
        version = m.global_step // U  # rollout steps trained: the weights the sampler holds now
        rollouts = -(-m.trainer.max_steps // U)
        # 1. the call's batches, picked now with the policy as it is, queued for the worker; the
        # last k data steps of a run would never train
        for batch in batches:
            rollout_step = version + len(queue.jobs)  # the batch's data step
            if rollout_step < rollouts:
                self.submit(m.feed.pick(batch, rollout_step, m.policy), rollout_step)
        # 2. the oldest rollout (k steps old), rows staler than k versions dropped; the feed
        # observes it; the updates' ratio is against its sampler's log-probs
        job, sampled, dropped = queue.take(version)
        curriculum = m.feed.observe(job.picked, sampled, job.rollout_step, m.rollout.settings.rows_per_prompt)
        extra = {"rollout/staleness": float(version - job.version), "rollout/stale_rows": float(dropped),
                 "rollout/stale_rows_total": float(queue.dropped)}
        return Groups(sampled, curriculum, extra)

    def weights_moved(self) -> None:
        """The queued rollouts finish, then the sampler takes the new weights."""
        m = self.module
        self.queue.drain()
        if self.copy is not None:
            self.copy.push(m.policy)
        else:
            m.rollout.engine.sync(m.policy, m.global_step)

    def pending(self) -> list[dict]:
        return self.queue.pending()

    def close(self) -> None:
        self.queue.close()
