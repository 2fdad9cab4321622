"""Batch sampler: every step draws one difficulty bucket, then that bucket's prompts.

Each batch is a pure function of (seed, step) and the schedule's weights at that step: ranks
agree on the bucket without talking (an adaptive schedule sees the same rank-averaged rewards
everywhere), the rank slices of one step are disjoint, and a resumed run (state_dict /
load_state_dict) continues with exactly the batches an uninterrupted run would have seen.

With online difficulty (`buckets_at`), the bucket members at a step come from the prompt history
(moves apply with a fixed lag, see prompts/history.py). A drawn bucket with too few members for the
step falls back to the bucket nearest to it that has enough.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence

from grpo_aug.data.records import BUCKETS
from grpo_aug.errors import UsageError


class CurriculumBatchSampler:
    def __init__(
        self,
        bucket_indices: Mapping[str, Sequence[int]],
        batch_size: int,
        schedule,
        total_steps: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        start_step: int = 0,
        buckets_at: Callable[[int], Mapping[str, Sequence[int]]] | None = None,
    ) -> None:
        self.buckets_at = buckets_at
        self.bucket_indices = {b: list(ix) for b, ix in bucket_indices.items()}
        self.batch_size = batch_size
        self.schedule = schedule
        self.total_steps = total_steps
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.start_step = start_step
        self.position = start_step  # the next step this sampler hands out
        per_step = batch_size * world_size
        for bucket, key in schedule.buckets_used().items():
            have = len(self.bucket_indices.get(bucket, ()))
            if have < per_step:
                raise UsageError(
                    f"{key} asks for bucket {bucket!r}, but it has {have} training prompts, fewer than "
                    f"data.batch_size x world size = {per_step}"
                )

    def bucket_at(self, step: int) -> str:
        weights = self.schedule.weights(step, self.total_steps)
        rng = random.Random(f"{self.seed}-bucket-{step}")
        names = [b for b, w in weights.items() if w > 0]
        return rng.choices(names, weights=[weights[b] for b in names])[0]

    def draw(self, step: int) -> tuple[str, list[int]]:
        """The step's bucket and this rank's prompt indices."""
        bucket = self.bucket_at(step)
        members = self.bucket_indices if self.buckets_at is None else self.buckets_at(step)
        per_step = self.batch_size * self.world_size
        if len(members.get(bucket, ())) < per_step:
            enough = [b for b in BUCKETS if len(members.get(b, ())) >= per_step]
            bucket = min(enough, key=lambda b: (abs(BUCKETS.index(b) - BUCKETS.index(bucket)), BUCKETS.index(b)))
        rng = random.Random(f"{self.seed}-prompts-{step}")
        chosen = rng.sample(list(members[bucket]), per_step)
        return bucket, chosen[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]

    def batch_at(self, step: int) -> list[int]:
        return self.draw(step)[1]

    def __iter__(self) -> Iterator[list[tuple[int, str]]]:
        # from the next step not yet handed out: should Lightning start another epoch, the run
        # goes on with new batches instead of repeating the first ones
        for step in range(self.position, self.total_steps):
            self.position = step + 1
            bucket, indices = self.draw(step)
            yield [(i, bucket) for i in indices]

    def state_dict(self) -> dict:
        return {"next_step": self.position, "seed": self.seed, "schedule": self.schedule.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self.seed:
            raise UsageError(f"the checkpoint's data seed {state['seed']} differs from this run's {self.seed}: "
                             "its batches cannot be continued")
        self.start_step = self.position = int(state["next_step"])
        self.schedule.load_state_dict(state["schedule"])

    def __len__(self) -> int:
        # the whole run, not what is left: a resumed Lightning loop restores its batch index
        # within the epoch and stops the epoch at this length
        return self.total_steps
