"""The data side of a resume and of passes without replacement, checked from outside the sampler:
PromptDataModule.state_dict() itself round-tripped (rollout.ahead 0 and 1), a bucket whose size
no step divides (steps span two passes), and buckets that change size mid-pass (online
difficulty)."""

from types import SimpleNamespace

import pytest

from grpo_aug.pipeline import prompt_datamodule
from grpo_aug.prompts.batch_sampler import CurriculumBatchSampler
from grpo_aug.prompts.curriculum import StagedSchedule
from helpers import compose_cfg


def _datamodule(tmp_path, ahead, step=0):
    # mixed batches without replacement, the default; a staged schedule needs no rewards observed
    cfg = compose_cfg(tmp_path, ["data.batch_size=5", "prompts/curriculum=staged"])
    dm = prompt_datamodule(cfg, total_steps=40, updates_per_batch=1, **({"ahead": ahead} if ahead else {}))
    dm.trainer = SimpleNamespace(global_step=step, global_rank=0, world_size=1)
    dm.setup("fit")
    return dm


@pytest.mark.parametrize("ahead", [0, 1])
def test_the_datamodules_own_state_dict_continues_the_batches(tmp_path, ahead):
    """Trained to step 13, the loader has handed out the 13 trained calls (the first with the
    `ahead` queued batches too) and the one Lightning fetched early; the saved state resumes at data
    step 13 + ahead, one batch per call."""
    dm = _datamodule(tmp_path, ahead)
    names = {i: r.id for i, r in enumerate(dm.train_records)}
    calls = list(dm.train_dataloader())
    assert len(calls) == 40 and [len(c) for c in calls[:2]] == [1 + ahead, 1]
    whole = [[p.id for p in batch] for call in calls for batch in call]  # one per data step
    assert len(whole) == 40 + ahead
    dm2 = _datamodule(tmp_path, ahead)
    loader = iter(dm2.train_dataloader())
    for _ in range(13 + 1):
        next(loader)
    dm2.trainer.global_step = 13
    state = dm2.state_dict()
    assert state["next_step"] == 13 + ahead
    resumed = _datamodule(tmp_path, ahead)
    resumed.load_state_dict(state)
    got = [[p.id for p in batch] for call in resumed.train_dataloader() for batch in call]
    assert all(len(call) == 1 for call in resumed.train_dataloader())
    assert got == whole[13 + ahead:]
    assert len(set(names.values())) == len(names)  # ids name prompts one to one: the comparison means it


def test_steps_that_span_two_passes_are_full_and_every_pass_covers_its_bucket_once():
    """7 prompts, 3 a step: steps 2, 4, 6, ... span two passes. Each step consumes pass positions
    [cursor_s, cursor_s+1) (the sampler's cursors, what a checkpoint saves); position p is in pass
    p // 7. A step that meets a prompt it already holds skips it in the new pass (counted there as
    covered). So per pass: the prompts handed out from it, plus those skipped, are the 7 once each."""
    size, per_step, steps = 7, 3, 30
    schedule = StagedSchedule([{"until": 1.0, "weights": {"easy": 1.0}}])
    sampler = CurriculumBatchSampler({"easy": list(range(size))}, per_step, schedule, steps, seed=3,
                                     without_replacement=True)
    batches, cursors = [], []
    for step, batch in enumerate(sampler):
        cursors.append(sampler.cursors[step]["easy"])
        batches.append([i for i, _ in batch])
    cursors.append(sampler.cursors[steps]["easy"])
    assert all(len(b) == per_step and len(set(b)) == per_step for b in batches)  # full, no duplicate
    handed = {}  # pass -> prompts handed out from it
    skipped = {}  # pass -> how many of its positions a step skipped
    for s, batch in enumerate(batches):
        start, end = cursors[s], cursors[s + 1]
        first_pass = start // size
        from_first = min(per_step, (first_pass + 1) * size - start)
        handed.setdefault(first_pass, []).extend(batch[:from_first])
        if end > (first_pass + 1) * size:  # the step ran into the next pass
            rest = batch[from_first:]
            handed.setdefault(first_pass + 1, []).extend(rest)
            extra = (end - (first_pass + 1) * size) - len(rest)
            skipped[first_pass + 1] = skipped.get(first_pass + 1, 0) + extra
            assert extra <= from_first  # only a prompt the step already held is ever skipped
    spans = sum(cursors[s] // size != (cursors[s + 1] - 1) // size for s in range(steps))
    assert spans >= 8  # the case this test is about happened often
    complete = cursors[-1] // size
    assert complete >= 10
    for n in range(complete):
        mine = handed[n]
        assert len(set(mine)) == len(mine), n  # no prompt twice within a pass
        assert len(mine) + skipped.get(n, 0) == size, n  # every prompt of the bucket once (or skipped)


def test_without_replacement_under_online_difficulty_keeps_steps_full_and_within_the_bucket():
    """The easy bucket grows from 8 to 12 prompts at step 6 and shrinks to 5 at step 14 (prompts
    moved by online difficulty): every step still holds distinct prompts of the bucket as it is at
    that step, and between the changes no prompt comes a third time before every one has come once."""
    def members(step):
        easy = list(range(8)) if step < 6 else list(range(12)) if step < 14 else [0, 2, 4, 6, 8]
        return {"easy": easy, "medium": [i for i in range(20, 40) if i not in easy], "hard": list(range(40, 60))}

    schedule = StagedSchedule([{"until": 1.0, "weights": {"easy": 1.0}}])
    sampler = CurriculumBatchSampler(members(0), 4, schedule, 22, seed=1, buckets_at=members,
                                     without_replacement=True)
    batches = [[i for i, _ in batch] for batch in sampler]
    for step, batch in enumerate(batches):
        assert len(batch) == 4 and len(set(batch)) == 4, step
        assert set(batch) <= set(members(step)["easy"]), step
    middle = [i for b in batches[6:14] for i in b]  # 32 draws of 12 prompts: each 2 or 3 times
    counts = [middle.count(i) for i in range(12)]
    assert min(counts) >= 2 and max(counts) - min(counts) <= 2, counts
    late = [i for b in batches[14:] for i in b]  # 32 draws of 5 prompts
    counts = [late.count(i) for i in (0, 2, 4, 6, 8)]
    assert max(counts) - min(counts) <= 2, counts
