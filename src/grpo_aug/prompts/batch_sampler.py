"""Batch sampler: every step draws one difficulty bucket, then that bucket's prompts; or, with
`mix` (data.mix_buckets), every step's batch mixes the buckets by the schedule's weights.

Each batch is a pure function of (seed, step) and the schedule's weights at that step: ranks
agree on the bucket without talking (an adaptive schedule sees the same rank-averaged rewards
everywhere), the rank slices of one step are disjoint, and a resumed run (state_dict /
load_state_dict) continues with exactly the batches an uninterrupted run would have seen.

With online difficulty (`buckets_at`), the bucket members at a step come from the prompt history
(moves apply with a fixed lag, see prompts/history.py). A drawn bucket with too few members for the
step falls back to the bucket nearest to it that has enough.

Mixed batches: the step's slots are shared out by systematic sampling (each bucket gets the floor
or the ceiling of weight x slots, its expected count exactly), then each bucket's prompts are drawn
and the whole is shuffled before the ranks take their slices. One update then averages over every
bucket the schedule weights, as a whole-pool shuffle does (TRL's GRPOTrainer): from the zoo's starts
that is where TRL led grpo-aug's one-bucket batches (docs/sample-efficiency.md).

Without replacement (data.without_replacement): a bucket's prompts are drawn in a seeded order, a new one for
each pass, so no prompt comes back before every prompt of its bucket has come once (an epoch per
bucket, as a shuffled dataloader draws); without it each step draws at random, and over a run some
prompts come many times while others never do. Each bucket's place in its order (a cursor) moves
by what the step drew; the cursors at each step are kept, saved with the checkpoint and restored,
so a resumed run continues the same order.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence

from grpo_aug.data.bucket_shares import systematic_counts
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
        mix: bool = False,
        without_replacement: bool = False,
    ) -> None:
        self.mix = mix
        self.without_replacement = without_replacement
        self._order_key: tuple | None = None  # the last pass order built, reused while the pool stays
        self._order: list[int] = []
        # bucket -> prompts drawn so far in pass order, at the start of each step (recent steps only)
        self.cursors: dict[int, dict[str, int]] = {start_step: dict.fromkeys(BUCKETS, 0)}
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
        # buckets the schedule may weight that hold no prompt: a mixed batch gives their slots to
        # the nearest buckets (the DataModule says so at setup); one bucket per batch cannot
        self.empty = {b: key for b, key in schedule.buckets_used().items() if not self.bucket_indices.get(b)}
        if mix:  # a bucket short of its slots passes them on: only the whole pool must fill a step
            have = sum(len(ix) for ix in self.bucket_indices.values())
            if have < per_step:
                raise UsageError(f"the data holds {have} training prompts, fewer than data.batch_size x world size "
                                 f"= {per_step}")
            return
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

    def draw(self, step: int) -> list[tuple[int, str]]:
        """This rank's (prompt index, bucket) pairs for the step."""
        if self.mix:
            return self.draw_mixed(step)
        bucket = self.bucket_at(step)
        members = self.bucket_indices if self.buckets_at is None else self.buckets_at(step)
        per_step = self.batch_size * self.world_size
        if len(members.get(bucket, ())) < per_step:
            enough = [b for b in BUCKETS if len(members.get(b, ())) >= per_step]
            bucket = min(enough, key=lambda b: (abs(BUCKETS.index(b) - BUCKETS.index(bucket)), BUCKETS.index(b)))
        rng = random.Random(f"{self.seed}-prompts-{step}")
        chosen = self.take(step, {bucket: per_step}, members, rng)
        return chosen[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]

    def draw_mixed(self, step: int) -> list[tuple[int, str]]:
        weights = self.schedule.weights(step, self.total_steps)
        members = self.bucket_indices if self.buckets_at is None else self.buckets_at(step)
        per_step = self.batch_size * self.world_size
        rng = random.Random(f"{self.seed}-mixed-{step}")
        counts = systematic_counts(weights, per_step, rng.random())
        # a bucket short of its count (online difficulty emptied it) passes the rest to the nearest
        # bucket with room, the easier one first
        for bucket in BUCKETS:
            short = counts[bucket] - len(members.get(bucket, ()))
            if short > 0:
                counts[bucket] -= short
                for other in sorted(BUCKETS, key=lambda b: (abs(BUCKETS.index(b) - BUCKETS.index(bucket)),
                                                            BUCKETS.index(b))):
                    room = min(short, len(members.get(other, ())) - counts[other])
                    if other != bucket and room > 0:
                        counts[other] += room
                        short -= room
        chosen = self.take(step, counts, members, rng)
        rng.shuffle(chosen)  # every rank's slice mixes the buckets too
        return chosen[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]

    def take(self, step: int, counts: Mapping[str, int], members: Mapping[str, Sequence[int]],
             rng: random.Random) -> list[tuple[int, str]]:
        """counts[b] distinct prompts of each bucket b: at random, or the next ones in pass order."""
        if not self.without_replacement:
            return [(i, b) for b in BUCKETS if counts.get(b, 0) > 0 for i in rng.sample(list(members[b]), counts[b])]
        if step not in self.cursors:
            raise RuntimeError(f"data.without_replacement: step {step} drawn out of order (the sampler's passes "
                               f"are known from step {min(self.cursors)} to {max(self.cursors)})")
        cursor, chosen = dict(self.cursors[step]), []
        for b in BUCKETS:
            pool, mine = tuple(members.get(b, ())), set()
            while len(mine) < min(counts.get(b, 0), len(pool)):
                # pass n of bucket b: its members in a seeded order; a step that spans two passes
                # skips a prompt the first already gave it
                n, at = divmod(cursor[b], len(pool))
                i = self.order(b, n, pool)[at]
                cursor[b] += 1
                if i not in mine:
                    mine.add(i)
                    chosen.append((i, b))
        self.cursors[step + 1] = cursor
        for old in [k for k in self.cursors if k < step - 64]:
            del self.cursors[old]  # a checkpoint reads a step at most `rollout.ahead` + 2 behind
        return chosen

    def order(self, bucket: str, n: int, pool: tuple[int, ...]) -> list[int]:
        """Pass n of a bucket whose members are `pool`: a seeded permutation (the last one kept)."""
        key = (bucket, n, pool)
        if self._order_key != key:
            self._order = list(pool)
            random.Random(f"{self.seed}-pass-{bucket}-{n}").shuffle(self._order)
            self._order_key = key
        return self._order

    def batch_at(self, step: int) -> list[int]:
        return [i for i, _ in self.draw(step)]

    def __iter__(self) -> Iterator[list[tuple[int, str]]]:
        # from the next step not yet handed out: should Lightning start another epoch, the run
        # goes on with new batches instead of repeating the first ones
        for step in range(self.position, self.total_steps):
            self.position = step + 1
            yield self.draw(step)

    def state_dict(self) -> dict:
        return {"next_step": self.position, "seed": self.seed, "schedule": self.schedule.state_dict(),
                "cursors": self.cursors_at(self.position)}

    def cursors_at(self, step: int) -> dict[str, int] | None:
        """Where each bucket's pass order stands at the start of `step` (None: with replacement)."""
        return dict(self.cursors[step]) if self.without_replacement else None

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self.seed:
            raise UsageError(f"the checkpoint's data seed {state['seed']} differs from this run's {self.seed}: "
                             "its batches cannot be continued")
        self.start_step = self.position = int(state["next_step"])
        self.schedule.load_state_dict(state["schedule"])
        if self.without_replacement:
            if state.get("cursors") is None:
                raise UsageError("data.without_replacement=true, but the checkpoint was saved without it: where its "
                                 "passes stood is unknown")
            self.cursors = {self.position: {b: int(v) for b, v in state["cursors"].items()}}

    def __len__(self) -> int:
        # the whole run, not what is left: a resumed Lightning loop restores its batch index
        # within the epoch and stops the epoch at this length
        return self.total_steps
