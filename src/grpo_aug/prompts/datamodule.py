"""LightningDataModule: curriculum-scheduled prompt batches (one bucket each, or mixed) and a held-out split."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
from collections import defaultdict
from typing import Protocol

import lightning as L
from torch.utils.data import DataLoader, Dataset

from grpo_aug.data.prompt_format import ChatPrompt, PlainPrompt
from grpo_aug.data.records import BUCKETS, Prompt
from grpo_aug.data.variants import Variants
from grpo_aug.errors import UsageError
from grpo_aug.prompts.batch_sampler import CurriculumBatchSampler
from grpo_aug.prompts.history import OnlineDifficulty, PromptHistory, StaticDifficulty

log = logging.getLogger(__name__)


class PromptSource(Protocol):
    def load(self, on_bad_row: str = "raise") -> list[Prompt]: ...
    def load_heldout(self, on_bad_row: str = "raise") -> list[Prompt] | None: ...


def _collate(batch: list[Prompt]) -> list[Prompt]:
    return batch


def _collate_steps(items: list[tuple[int, Prompt]]) -> list[list[Prompt]]:
    """(slot, record) items -> one batch of records per slot, in slot order."""
    batches: list[list[Prompt]] = [[] for _ in range(1 + max((slot for slot, _ in items), default=0))]
    for slot, record in items:
        batches[slot].append(record)
    return batches


class StepBatches:
    """What a training call receives: the batches of the data steps it starts. The first call of
    a run with `rollout.ahead=k` starts data steps 0..k (their rollouts are queued at once: the
    first trains on step 0's), every other call one step. Yields (index, bucket, slot) keys, slot
    being the batch's place in the call's list."""

    def __init__(self, sampler: CurriculumBatchSampler, ahead: int) -> None:
        self.sampler, self.ahead = sampler, ahead

    def __iter__(self):
        steps = iter(self.sampler)
        first = self.ahead + 1 if self.sampler.position == 0 else 1  # a resumed run's queue is in its checkpoint
        group = list(itertools.islice(steps, first))
        while group:
            yield [(index, bucket, slot) for slot, keys in enumerate(group) for index, bucket in keys]
            group = list(itertools.islice(steps, 1))

    def __len__(self) -> int:
        return len(self.sampler) - self.ahead  # training calls over the whole run


class PaddingBatch(list):
    """A held-out batch that only evens out the ranks' batch counts: under sharded weights every
    forward is a collective, so a rank with fewer batches must still join the others' forwards.
    It is generated but not counted (and skipped where weights are not sharded)."""


class BucketedRecords(Dataset):
    """Training records indexed by (index, bucket): the record as the bucket it was drawn from
    (its online bucket may differ from the one its data source gave it)."""

    def __init__(self, records: list[Prompt]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, key: tuple[int, str]) -> Prompt:
        index, bucket = key
        record = self.records[index]
        return record if record.bucket == bucket else dataclasses.replace(record, bucket=bucket)


class SlottedRecords(BucketedRecords):
    """The same, keyed (index, bucket, slot) by `StepBatches`: (slot, record)."""

    def __getitem__(self, key: tuple[int, str, int]) -> tuple[int, Prompt]:
        index, bucket, slot = key
        return slot, super().__getitem__((index, bucket))


def split_heldout(records: list[Prompt], per_bucket: int, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """Hold out `per_bucket` prompts of each bucket (seeded choice); the rest is training data."""
    by_bucket: dict[str, list[Prompt]] = defaultdict(list)
    for r in records:
        by_bucket[r.bucket].append(r)
    train, heldout = [], []
    for bucket in BUCKETS:
        pool = list(by_bucket[bucket])
        random.Random(f"{seed}-heldout-{bucket}").shuffle(pool)
        heldout += pool[:per_bucket]
        train += pool[per_bucket:]
    return train, heldout


class RecordData(L.LightningDataModule):
    """Batches of prompt records. The transfer hook lives here, with the batches' type: records are
    frozen text dataclasses that Lightning's default transfer cannot copy, and the rollout
    tokenises them on the model's device itself."""

    def transfer_batch_to_device(self, batch: list[Prompt], device, dataloader_idx: int) -> list[Prompt]:
        return batch


class FixedBatches(RecordData):
    """Given batches of records, trained in order (unit tests and benchmarks that script the data);
    with `ahead=k` the first call gets the first k + 1 (as `StepBatches` gives them)."""

    def __init__(self, batches: list[list[Prompt]], ahead: int = 0) -> None:
        super().__init__()
        self.calls = [batches[: ahead + 1]] + [[b] for b in batches[ahead + 1 :]]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.calls, batch_size=None, collate_fn=_collate)


class PromptDataModule(RecordData):
    def __init__(
        self,
        source: PromptSource,
        schedule,
        total_steps: int,
        batch_size: int = 16,
        heldout_per_bucket: int = 200,
        val_batch_size: int = 200,
        seed: int = 0,
        variants: Variants | None = None,
        updates_per_batch: int = 1,
        on_bad_row: str = "raise",
        difficulty: StaticDifficulty | OnlineDifficulty | None = None,
        history_smoothing: float = 0.5,
        prompt_format: PlainPrompt | ChatPrompt | None = None,
        eval_path: str | None = None,
        ahead: int = 0,
        mix_buckets: bool = True,
        without_replacement: bool = True,
    ) -> None:
        """total_steps counts optimizer steps; each batch is rolled out once and trained on
        `updates_per_batch` times (algo.num_iterations x algo.minibatches). ahead: rollout.ahead,
        batches drawn before the one in training (k more in all, and k more at a checkpoint).
        mix_buckets: every batch holds the buckets in the schedule's proportions, instead of one
        bucket drawn with them. without_replacement: a bucket's prompts come in seeded passes, none
        twice before all have come once (prompts/batch_sampler.py)."""
        super().__init__()
        if batch_size < 1:
            raise UsageError(f"data.batch_size must be >= 1, got {batch_size}")
        if on_bad_row not in ("raise", "skip"):
            raise UsageError(f"data.on_bad_row must be one of ('raise', 'skip'), got {on_bad_row!r}")
        self.on_bad_row = on_bad_row
        self.source = source
        self.schedule = schedule
        self.updates_per_batch = updates_per_batch
        self.ahead = ahead
        self.mix_buckets = bool(mix_buckets)
        self.without_replacement = bool(without_replacement)
        self.sampler: CurriculumBatchSampler | None = None  # the training loader's, for its pass cursors
        self.total_steps = -(-total_steps // updates_per_batch) + ahead  # batches, rounded up
        self.batch_size = batch_size
        self.heldout_per_bucket = heldout_per_bucket
        self.val_batch_size = val_batch_size
        self.seed = seed
        self.variants = variants
        if eval_path is not None and not hasattr(source, "load_eval"):
            raise UsageError(f"data.eval_path={eval_path!r}: the data source {type(source).__name__} reads no files; "
                             "use data=gsm8k or data=dataset")
        self.eval_path = eval_path  # every problem of this file is evaluated, in file order
        self.prompt_format = prompt_format or PlainPrompt()  # applied by the module, which has the tokenizer
        # every training prompt's rollouts so far; with online difficulty it also moves prompts
        # between buckets (updated by the module's PromptSelection, saved in checkpoints)
        self.history = PromptHistory(difficulty, history_smoothing)
        self.train_records: list[Prompt] = []
        self.heldout_records: list[Prompt] = []
        self._restored: dict | None = None  # sampler state from a checkpoint, used by train_dataloader

    def setup(self, stage: str | None = None) -> None:
        if self.train_records:
            return
        records = self.source.load(self.on_bad_row)
        if self.eval_path is not None:
            self.train_records, self.heldout_records = records, self.source.load_eval(self.eval_path, self.on_bad_row)
        elif (heldout := self.source.load_heldout(self.on_bad_row)) is None:
            self.train_records, self.heldout_records = split_heldout(records, self.heldout_per_bucket, self.seed)
        else:
            self.train_records = records
            self.heldout_records = split_heldout(heldout, self.heldout_per_bucket, self.seed)[1]
        if self.variants is not None and self.variants.per_prompt > 0:
            # after the split: a held-out problem never reaches training as a variant
            made = self.variants.make(self.train_records, held_out={r.question for r in self.heldout_records})
            log.info("data.variants: %d variants from %d training prompts (%d of %d attempts failed, "
                     "%d dropped as held-out questions)", len(made), len(self.train_records),
                     sum(self.variants.failures.values()), self.variants.attempts, self.variants.held_out)
            self.train_records = self.train_records + made
        if getattr(self.source, "tiers", None) == "pass_rate":
            return  # buckets come from the starting policy (retier), then the checks below run
        self.start_buckets()

    def retier(self, buckets: dict[str, str]) -> None:
        """New buckets by record id (every training and held-out record), then the setup checks."""
        self.train_records = [dataclasses.replace(r, bucket=buckets[r.id]) for r in self.train_records]
        self.heldout_records = [dataclasses.replace(r, bucket=buckets[r.id]) for r in self.heldout_records]
        self.start_buckets()

    def start_buckets(self) -> None:
        self.history.start({r.id: r.bucket for r in self.train_records})
        # fail now, not at the step that first needs the bucket
        sampler = self.make_sampler(start_step=0, rank=0, world_size=self._world_size())
        for bucket, key in sampler.empty.items():
            log.warning("%s may weight bucket %r, which has no training prompts: its share of each batch goes to "
                        "the nearest buckets", key, bucket)

    def _world_size(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

    def make_sampler(self, start_step: int, rank: int, world_size: int) -> CurriculumBatchSampler:
        indices: dict[str, list[int]] = defaultdict(list)
        for i, r in enumerate(self.train_records):
            indices[r.bucket].append(i)
        online = self.members_at if self.history.difficulty.online else None
        return CurriculumBatchSampler(
            indices, self.batch_size, self.schedule, self.total_steps, self.seed, rank, world_size, start_step, online,
            self.mix_buckets, self.without_replacement,
        )

    def bucket_of(self, record: Prompt, step: int) -> str:
        return self.history.bucket_at(record.id, record.bucket, step)

    def members_at(self, step: int) -> dict[str, list[int]]:
        """Indices of the training records in each bucket at sampler step `step`."""
        members: dict[str, list[int]] = {b: [] for b in BUCKETS}
        for i, r in enumerate(self.train_records):
            members[self.bucket_of(r, step)].append(i)
        return members

    def train_dataloader(self) -> DataLoader:
        rank = self.trainer.global_rank if self.trainer is not None else 0
        sampler = self.make_sampler(0, rank, self._world_size())
        if self._restored is not None:
            sampler.load_state_dict(self._restored)
        self.sampler = sampler
        return DataLoader(SlottedRecords(self.train_records), batch_sampler=StepBatches(sampler, self.ahead),
                          collate_fn=_collate_steps)

    def state_dict(self) -> dict:
        """The sampler's position and schedule state, saved in Lightning checkpoints.

        The position comes from the trainer, not from the sampler: Lightning has already fetched
        the next batch when it saves, so the sampler itself is one step ahead.
        """
        done = self.trainer.global_step // self.updates_per_batch if self.trainer is not None else 0
        done += self.ahead * (done > 0)  # the queued batches are in the module's checkpoint state
        return {"next_step": done, "seed": self.seed, "schedule": self.schedule.state_dict(),
                "history": self.history.state_dict(),
                "cursors": None if self.sampler is None else self.sampler.cursors_at(done)}

    def load_state_dict(self, state: dict) -> None:
        self._restored = state
        if "history" in state:  # now: the module's selection shares this history object
            self.history.load_state_dict(state["history"])

    def draw_prompts(self, bucket: str, n: int, step: int, round_: int, used: set[str],
                     purpose: str = "refill") -> list[Prompt]:
        """Up to n training prompts of `bucket` (at `step`) not in `used`, as records of that bucket;
        deterministic by (seed, purpose, step, round, rank)."""
        rank = self.trainer.global_rank if self.trainer is not None else 0
        pool = [(r, b) for r in self.train_records if r.id not in used and (b := self.bucket_of(r, step)) == bucket]
        drawn = random.Random(f"{self.seed}-{purpose}-{step}-{round_}-{rank}").sample(pool, min(n, len(pool)))
        return [r if r.bucket == b else dataclasses.replace(r, bucket=b) for r, b in drawn]

    def val_batches(self, rank: int = 0, world_size: int = 1) -> list[list[Prompt]]:
        """Single-bucket batches of held-out prompts; rank r evaluates batches r, r + W, ...; ranks
        with one batch fewer end with a one-prompt PaddingBatch, so every rank runs as many."""
        batches = []
        for bucket in BUCKETS:
            rows = [r for r in self.heldout_records if r.bucket == bucket]
            batches += [rows[i : i + self.val_batch_size] for i in range(0, len(rows), self.val_batch_size)]
        mine = batches[rank::world_size]
        per_rank = -(-len(batches) // world_size)
        return mine + [PaddingBatch(batches[0][:1]) for _ in range(per_rank - len(mine))]

    def val_dataloader(self) -> DataLoader:
        trainer = self.trainer
        rank = trainer.global_rank if trainer is not None else 0
        batches = self.val_batches(rank, self._world_size())
        return DataLoader(batches, batch_size=None, collate_fn=_collate)
