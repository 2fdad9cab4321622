"""Per-prompt history and online difficulty, checked against values worked out by hand."""

import pytest

from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.prompts.batch_sampler import CurriculumBatchSampler
from grpo_aug.prompts.curriculum import StagedSchedule
from grpo_aug.prompts.datamodule import PromptDataModule
from grpo_aug.prompts.history import LAG, OnlineDifficulty, Outcome, PromptHistory


def test_history_counts_smooths_and_streaks():
    h = PromptHistory(smoothing=0.5)
    h.start({"a": "easy"})
    h.observe(3, [Outcome("a", 0.0, True, "easy")])
    h.observe(5, [Outcome("a", 0.0, True, "easy")])
    h.observe(9, [Outcome("a", 1.0, False, "easy")])
    h.observe(11, [Outcome("a", 0.5, False, "easy")])
    r = h.get("a")
    assert r.attempts == 4 and r.last_pass == 0.5 and r.last_seen == 11
    # 0 -> 0 -> 0.5 * 0 + 0.5 * 1 = 0.5 -> 0.5 * 0.5 + 0.5 * 0.5 = 0.5
    assert r.smoothed_pass == pytest.approx(0.5)
    assert r.flat_streak == 0
    h.observe(12, [Outcome("a", 1.0, True, "easy"), Outcome("a", 1.0, True, "easy")])  # two ranks drew it
    assert h.get("a").flat_streak == 2 and h.get("a").attempts == 6


def test_online_moves_with_hysteresis_and_lag():
    h = PromptHistory(OnlineDifficulty(easy_at=0.8, hard_at=0.1, margin=0.1), smoothing=1.0)  # rate = last rate
    h.start({"p": "easy", "q": "medium"})
    assert h.observe(0, [Outcome("p", 0.3, False, "easy"), Outcome("q", 0.0, True, "medium")]) == {
        "easy_medium": 1, "medium_hard": 1}
    # a move observed at step 0 applies from step LAG on
    assert [h.bucket_at("p", "easy", s) for s in range(LAG + 1)] == ["easy"] * LAG + ["medium"]
    assert h.bucket_at("q", "medium", LAG) == "hard"
    # hard is left only above hard_at + margin = 0.2
    assert h.observe(1, [Outcome("q", 0.15, False, "hard")]) == {}
    assert h.observe(2, [Outcome("q", 0.25, False, "hard")]) == {"hard_medium": 1}
    # medium -> easy at 0.8; easy is left only below 0.8 - 0.1 = 0.7
    assert h.observe(3, [Outcome("p", 0.8, True, "medium")]) == {"medium_easy": 1}
    assert h.observe(4, [Outcome("p", 0.75, False, "easy")]) == {}
    assert h.observe(5, [Outcome("p", 0.65, False, "easy")]) == {"easy_medium": 1}
    assert h.moved == {"easy_medium": 2, "medium_hard": 1, "hard_medium": 1, "medium_easy": 1}
    assert h.bucket_at("p", "easy", 4) == "medium" and h.bucket_at("p", "easy", 5) == "easy"
    assert h.bucket_at("p", "easy", 7) == "medium"
    assert [h.bucket_at(k, h.static[k], 100) for k in "pq"] == ["medium", "medium"]


def test_history_state_round_trip():
    h = PromptHistory(OnlineDifficulty(), smoothing=0.5)
    h.start({"a": "easy", "b": "hard"})
    h.observe(0, [Outcome("a", 0.0, True, "easy"), Outcome("b", 0.5, False, "hard")])
    copy = PromptHistory(OnlineDifficulty(), smoothing=0.5)
    copy.start({"a": "easy", "b": "hard"})
    copy.load_state_dict(h.state_dict())
    assert copy.records == h.records and copy.moved == h.moved
    assert [copy.bucket_at(k, "easy", 9) for k in "ab"] == [h.bucket_at(k, "easy", 9) for k in "ab"]


def test_bad_thresholds_are_named():
    with pytest.raises(ValueError, match="hard_at < easy_at"):
        OnlineDifficulty(easy_at=0.1, hard_at=0.5)
    with pytest.raises(ValueError, match="margin"):
        OnlineDifficulty(easy_at=0.6, hard_at=0.4, margin=0.3)


def _datamodule(difficulty):
    schedule = StagedSchedule([{"until": 1.0, "weights": {"easy": 1.0}}])
    dm = PromptDataModule(SyntheticArithmetic(size_per_bucket=40, seed=0), schedule, total_steps=20, batch_size=4,
                          heldout_per_bucket=5, difficulty=difficulty, history_smoothing=1.0)
    dm.setup("fit")
    return dm


def test_online_buckets_reach_the_batches_and_the_refill():
    dm = _datamodule(OnlineDifficulty())
    easy = [r for r in dm.train_records if r.bucket == "easy"]
    # every easy prompt but four turns out hard at step 0: from step LAG on, "easy" is those four
    outcomes = [Outcome(r.id, 0.0 if i >= 4 else 1.0, True, "easy") for i, r in enumerate(easy)]
    dm.history.observe(0, outcomes)
    members = dm.members_at(LAG)
    assert sorted(dm.train_records[i].id for i in members["easy"]) == sorted(r.id for r in easy[:4])
    assert len(members["hard"]) == 35 + len(easy) - 4 and len(dm.members_at(LAG - 1)["easy"]) == len(easy)
    sampler = dm.make_sampler(0, 0, 1)
    for step, batch in enumerate(sampler):
        if step >= LAG:
            assert {i for i, _ in batch} <= set(members["easy"]) and {b for _, b in batch} == {"easy"}
        if step == LAG + 1:
            break
    drawn = dm.draw_prompts("hard", 50, LAG, 1, set())
    assert {p.bucket for p in drawn} == {"hard"} and len(drawn) == 50
    assert {p.id for p in drawn} & {r.id for r in easy[4:]}  # moved easy prompts come as hard ones


def test_a_bucket_too_small_falls_back_to_the_nearest():
    schedule = StagedSchedule([{"until": 1.0, "weights": {"medium": 1.0}}])
    indices = {"easy": [0, 1, 2, 3], "medium": [4, 5, 6, 7], "hard": [8, 9, 10, 11]}
    moved = {"easy": [0, 1, 2, 3, 4, 5], "medium": [6], "hard": [7, 8, 9, 10, 11]}  # medium emptied to 1
    sampler = CurriculumBatchSampler(indices, 4, schedule, 10, buckets_at=lambda step: moved)
    drawn = sampler.draw(0)
    # both neighbours qualify: the easier one
    assert {b for _, b in drawn} == {"easy"} and {i for i, _ in drawn} <= set(moved["easy"])


def test_datamodule_checkpoint_carries_the_history():
    dm = _datamodule(OnlineDifficulty())
    dm.history.observe(0, [Outcome(dm.train_records[0].id, 0.0, True, "easy")])
    state = dm.state_dict()
    fresh = _datamodule(OnlineDifficulty())
    fresh.load_state_dict(state)
    assert fresh.history.records == dm.history.records and fresh.history.moved == {"easy_hard": 1}
