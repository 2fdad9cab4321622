"""Prompt selection: skip probabilities by hand, seeded decisions, audits, learning, metrics."""

import dataclasses
import math
import random

import pytest
import torch

from grpo_aug.data.records import Prompt
from grpo_aug.prompts.history import Outcome, PromptHistory, PromptRecord
from grpo_aug.prompts.predictors import HistoryPredictor, LearnedPredictor, NoPredictor, features
from grpo_aug.prompts.selection import GroupOutcome, PromptSelection, RankedSelection
from grpo_aug.step_types import Picked


def _prompts(n, bucket="easy", prefix="p"):
    return [Prompt(f"{prefix}{i}", f"What is {i} + 1?", f"Q: What is {i} + 1?\nA: ", str(i + 1), "", bucket)
            for i in range(n)]


POOL = _prompts(40, prefix="r")


class Pool:
    def __init__(self):
        self.calls = []

    def __call__(self, bucket, n, step, round_, used, purpose="refill"):
        self.calls.append((bucket, n, round_, purpose))
        return [dataclasses.replace(p, bucket=bucket) for p in POOL if p.id not in used][:n]


def test_history_selector_probabilities_by_hand():
    s = HistoryPredictor(decay=0.5, explore=0.1)
    assert s.skip_probability(10, "easy", None, 0) == 0.0
    assert s.skip_probability(10, "easy", PromptRecord(attempts=3, flat_streak=0), 0) == 0.0
    assert s.skip_probability(10, "easy", PromptRecord(attempts=1, flat_streak=1), 0) == 0.5
    assert s.skip_probability(10, "easy", PromptRecord(attempts=2, flat_streak=2), 0) == 0.75
    assert s.skip_probability(10, "easy", PromptRecord(attempts=9, flat_streak=9), 0) == 0.9  # explore floor


def _selection(selector, history=None, audit=0.0, max_rounds=2, seed=0):
    return PromptSelection(selector, history or PromptHistory(), Pool(), seed=seed, audit=audit, max_rounds=max_rounds)


def test_pick_skips_by_seeded_draws_and_replaces_from_the_bucket():
    history = PromptHistory()
    batch = _prompts(8)
    history.start({p.id: p.bucket for p in batch + POOL})
    history.observe(0, [Outcome(p.id, 0.0, True, "easy") for p in batch for _ in range(3)])  # streak 3
    sel = _selection(HistoryPredictor(decay=0.5, explore=0.1), history)
    picked = sel.pick(batch, step=7)
    # the same rule written out: skip where the (seed, step, id) draw falls under 1 - 0.5^3 = 0.875
    expect_kept = [p.id for p in batch if random.Random(f"0-select-7-{p.id}").random() >= 0.875]
    assert [p.id for p in picked.prompts[: len(expect_kept)]] == expect_kept
    assert len(picked.prompts) == 8 and picked.skipped == 8 - len(expect_kept)
    # spares for both rounds are drawn up front; the first ones replace the skips (no streak: kept)
    assert sel.pool.calls == [("easy", 8 * 2, 1, "select")]
    assert [p.id for p in picked.prompts[len(expect_kept):]] == [f"r{i}" for i in range(8 - len(expect_kept))]
    assert picked.considered == 8 + 8 - len(expect_kept)
    # another rank (another object, same history, same seed) decides the same for the same prompt
    assert _selection(HistoryPredictor(decay=0.5, explore=0.1), history).pick(batch, 7).prompts == picked.prompts


def test_audits_roll_out_a_share_of_would_be_skips():
    history = PromptHistory()
    batch = _prompts(400)
    history.observe(0, [Outcome(p.id, 1.0, True, "easy") for p in batch for _ in range(20)])
    picked = _selection(HistoryPredictor(decay=0.5, explore=0.1), history, audit=0.25, max_rounds=0).pick(batch, 3)
    # skip probability 0.9 each, a quarter of those audited: ~0.1 + 0.9 * 0.25 = 0.325 rolled out
    assert 0.25 < len(picked.prompts) / 400 < 0.40
    assert 0.15 < len(picked.audited) / 400 < 0.30
    assert picked.skipped == 400 - len(picked.prompts)


def test_a_step_never_rolls_out_nothing():
    history = PromptHistory()
    batch = _prompts(1)
    history.observe(0, [Outcome("p0", 1.0, True, "easy")] * 50)
    sel = PromptSelection(HistoryPredictor(explore=0.01), history, lambda *a, **k: [], seed=0, audit=0.0)
    for step in range(30):
        picked = sel.pick(batch, step)
        assert [p.id for p in picked.prompts] == ["p0"]


def test_no_selector_rolls_out_the_batch():
    batch = _prompts(5)
    picked = PromptSelection().pick(batch, 0)
    assert picked.prompts == batch and picked.skipped == 0


def test_learned_selector_one_sgd_step_by_hand():
    s = LearnedPredictor(lr=0.5, l2=0.0, warmup_groups=0)
    x = features(100, "hard", None, 4)
    s.learn(100, "hard", None, 4, flat=True)
    # from zero weights p = 0.5, so each weight moves by -lr * (0.5 - 1) * x = 0.25 x
    assert s.weights == pytest.approx([0.25 * v for v in x])
    z = sum(0.25 * v * v for v in x)
    assert s.flat_probability(100, "hard", None, 4) == pytest.approx(1 / (1 + math.exp(-z)))


def test_a_likelihood_selector_scores_batch_and_spares_in_one_call_and_reads_the_scores():
    batch = _prompts(4)
    calls = []

    def score(prompts):
        calls.append([p.id for p in prompts])
        return [-0.01 if p.id in ("p1", "p3") else -5.0 for p in prompts]  # p1, p3: reference near certain

    class SkipCertain(LearnedPredictor):
        def flat_probability(self, length, bucket, record, step, reference=None):
            return 1.0 if reference is not None and reference > -0.1 else 0.0

    sel = _selection(SkipCertain(explore=1e-9), audit=0.0, max_rounds=1)
    picked = sel.pick(batch, 2, score)
    assert calls == [["p0", "p1", "p2", "p3", "r0", "r1", "r2", "r3"]]  # one forward per step
    assert [p.id for p in picked.prompts] == ["p0", "p2", "r0", "r1"]
    assert picked.references["r0"] == -5.0 and picked.skipped == 2
    with pytest.raises(ValueError, match="likelihood"):
        _selection(SkipCertain(explore=1e-9)).pick(batch, 2)
    # the references reach the learner with the outcomes, on every rank alike
    sampled = _Sampled(picked.prompts, ["A: 1", "A: 1"] * 4, [False, True, True, True])
    seen = []
    sel.predictor.learn = lambda length, bucket, record, step, flat, reference=None: seen.append((flat, reference))
    sel.observe(picked, sampled, 2, rows_per_group=2, gather=lambda x: [x])
    assert seen == [(True, -5.0), (False, -5.0), (False, -5.0), (False, -5.0)]


def test_rank_keeps_the_candidates_least_likely_flat_and_audits_a_share_of_the_slots():
    batch = _prompts(4)
    q = {"p0": 0.9, "p1": 0.2, "p2": 0.6, "p3": 0.05, "r0": 0.3, "r1": 0.9, "r2": 0.1, "r3": 0.45}

    class ByHand(LearnedPredictor):  # the flat probability is what the "likelihood" score hands over
        def flat_probability(self, length, bucket, record, step, reference=None):
            return reference

    def score(prompts):
        return [q[p.id] for p in prompts]

    sel = RankedSelection(ByHand(), PromptHistory(), Pool(), audit=0.0, spares=1)
    picked = sel.pick(batch, 5, score)
    # sorted by flat probability: p3 .05, r2 .1, p1 .2, r0 .3 fill the 4 slots; r3, p2, p0, r1 are left out
    assert [p.id for p in picked.prompts] == ["p3", "r2", "p1", "r0"]
    assert picked.skipped == 4 and picked.considered == 8 and not picked.audited
    # none above max_flat: with only 0.05 and 0.1 allowed, the step trains on two groups
    sel.max_flat = 0.15
    assert [p.id for p in sel.pick(batch, 5, score).prompts] == ["p3", "r2"]
    # audit 0.5 of 4 slots: 2 slots go to would-be skips drawn at random, the rest by rank
    sel.max_flat, sel.audit = 0.5, 0.5
    picked = sel.pick(batch, 5, score)
    assert [p.id for p in picked.prompts[:2]] == ["p3", "r2"]
    assert len(picked.audited) == 2 and picked.audited <= {"p1", "r0", "r3", "p2", "p0", "r1"}
    assert {p.id for p in picked.prompts[2:]} == picked.audited
    assert picked.skipped == 8 - 4
    with pytest.raises(ValueError, match="spares must be >= 0, got -1"):
        RankedSelection(ByHand(), PromptHistory(), Pool(), spares=-1)
    with pytest.raises(ValueError, match="max_flat must be in"):
        RankedSelection(ByHand(), PromptHistory(), Pool(), max_flat=0.0)


def test_learned_selector_learns_flat_from_the_reference_likelihood_of_unseen_prompts():
    s = LearnedPredictor(lr=0.2, warmup_groups=50)
    rng = random.Random(0)
    # never rolled out (no history): only the policy's likelihood of the reference tells them apart;
    # near-certain references and far-out-of-reach ones come out flat, the ones in between do not
    cases = [(-0.02, 0.95), (-15.0, 0.95), (-1.5, 0.1)]  # (log p(reference), chance of a flat group)
    for _ in range(1500):
        reference, p_flat = rng.choice(cases)
        s.learn(40, "medium", None, 3, flat=rng.random() < p_flat, reference=reference)
    assert s.flat_probability(40, "medium", None, 3, -0.02) > 0.8
    assert s.flat_probability(40, "medium", None, 3, -15.0) > 0.8
    assert s.flat_probability(40, "medium", None, 3, -1.5) < 0.25
    assert s.flat_probability(40, "medium", None, 3, None) != s.flat_probability(40, "medium", None, 3, -1.5)


def test_learned_selector_learns_which_prompts_come_out_flat():
    s = LearnedPredictor(lr=0.2, warmup_groups=50)
    rng = random.Random(0)
    seen_never_solved = PromptRecord(attempts=2, smoothed_pass=0.0, flat_streak=2, last_seen=0)
    half_solved = PromptRecord(attempts=2, smoothed_pass=0.5, flat_streak=0, last_seen=0)
    assert s.flat_probability(40, "medium", seen_never_solved, 3) == 0.0  # still warming up
    for _ in range(400):
        if rng.random() < 0.5:
            s.learn(40, "medium", seen_never_solved, 3, flat=rng.random() < 0.95)
        else:
            s.learn(40, "medium", half_solved, 3, flat=rng.random() < 0.05)
    assert s.flat_probability(40, "medium", seen_never_solved, 3) > 0.8
    assert s.flat_probability(40, "medium", half_solved, 3) < 0.2
    copy = LearnedPredictor()
    copy.load_state_dict(s.state_dict())
    assert copy.flat_probability(40, "medium", half_solved, 3) == s.flat_probability(40, "medium", half_solved, 3)


class _Sampled:
    def __init__(self, prompts, texts, informative):
        self.prompts = prompts
        self.rewards = torch.zeros(len(prompts), len(texts) // len(prompts))
        self.rollout = type("R", (), {"texts": texts})()
        self.informative = torch.tensor(informative)
        self.tokens = 7
        self.reflected = None
        self.rows_present = torch.ones_like(self.rewards, dtype=torch.bool)  # every row exists (no budget)


def test_observe_updates_history_from_every_rank_and_counts_the_window():
    history = PromptHistory()
    sel = _selection(HistoryPredictor(), history, audit=0.5)
    mine = _prompts(2)
    sampled = _Sampled(mine, ["A: 1", "A: 1", "A: 9", "A: 2"], [False, True])  # p0 right twice, p1 right once
    picked = Picked(mine, frozenset({"p0"}), skipped=3, considered=5, references={})
    other = ([GroupOutcome("x", 30, "easy", 0.0, True, False, 8)], 1, 3, 5)  # the other rank's groups and counts
    sel.observe(picked, sampled, 4, rows_per_group=2, gather=lambda mine_: [mine_, other])
    assert history.get("p0").last_pass == 1.0 and history.get("p0").flat_streak == 1
    assert history.get("p1").last_pass == 0.5 and history.get("p1").flat_streak == 0
    assert history.get("x").attempts == 1 and history.get("x").last_seen == 4
    m = sel.window_metrics()
    # rows: p0 2 (flat), p1 2, x 8 (flat) -> 10 / 12 wasted; 4 skips of 8 considered;
    # 1 audit, flat: precision 1; caught = 4 x 1, let through flat: x -> recall 4 / 5;
    # 3 distinct prompts (p0, p1, x), each rolled out once
    once = {"prompts/seen": 3.0, "prompts/attempts_mean": 1.0, "prompts/attempts_max": 1.0}
    assert m == pytest.approx({"rollout/tokens_total": 12, "rollout/flat_rows_frac": 10 / 12, "selector/skip_frac": 0.5,
                               "selector/precision": 1.0, "selector/recall": 0.8, **once})
    assert sel.window_metrics() == {"rollout/tokens_total": 12, "selector/skip_frac": 0.0, **once}  # a new window
    # p0 and p1 again (this rank only): attempts 2, 2, 1 -> mean 5 / 3, most 2
    sel.observe(picked, sampled, 5, rows_per_group=2, gather=lambda mine_: [mine_])
    m = sel.window_metrics()
    assert (m["prompts/seen"], m["prompts/attempts_mean"], m["prompts/attempts_max"]) == pytest.approx((3, 5 / 3, 2))


def test_slots_a_budget_left_empty_count_neither_in_the_pass_rate_nor_in_the_rows():
    sel = PromptSelection()
    mine = _prompts(2)  # answers 1 and 2
    # width 4: p0 got 2 rows (right, wrong), p1 got 4 (right 3 times); the empty slots' text is ""
    sampled = _Sampled(mine, ["A: 1", "A: 9", "", "", "A: 2", "A: 2", "A: 2", "A: 7"], [True, True])
    sampled.rows_present = torch.tensor([[True, True, False, False], [True] * 4])
    sel.observe(Picked(mine, frozenset(), 0, 2, {}), sampled, 0, 4, lambda x: [x])
    assert sel.history.get("p0").last_pass == 0.5 and sel.history.get("p1").last_pass == 0.75
    assert sel.window["rows"] == 6


def test_no_selector_still_measures_the_waste():
    sel = PromptSelection()
    mine = _prompts(1)
    sel.observe(Picked(mine, frozenset(), 0, 1, {}), _Sampled(mine, ["A: 5", "A: 5"], [False]), 0, 2, lambda x: [x])
    # one prompt rolled out once: the spread is measured without a selector too
    assert sel.window_metrics() == {"rollout/tokens_total": 7, "rollout/flat_rows_frac": 1.0, "prompts/seen": 1.0,
                                    "prompts/attempts_mean": 1.0, "prompts/attempts_max": 1.0}
    assert isinstance(sel.predictor, NoPredictor)


def test_pick_reports_the_mean_flat_probability_of_every_candidate_once_calibrated():
    class ByLength:  # flat probability 0.02 per prompt character over 20
        active, likelihood = True, False

        def __init__(self, calibrated):
            self.calibrated = calibrated

        def flat_probability(self, length, bucket, record, step, reference=None):
            return 0.02 * (length - 20)

        def skip_probability(self, length, bucket, record, step, reference=None):
            return 0.0

    batch = _prompts(12)[8:]  # "Q: What is 8 + 1?\nA: " has 21 characters (0.02), "... 10 + 1? ..." 22 (0.04)
    warm = RankedSelection(ByLength(True), PromptHistory(), Pool(), spares=1).pick(batch, 0)
    # 4 batch (0.02, 0.02, 0.04, 0.04) + 4 spares r0..r3 (0.02 each)
    assert warm.flat_predicted == {"easy": pytest.approx((6 * 0.02 + 2 * 0.04) / 8)}
    # a mixed batch: spares in its proportions, each bucket's mean on its own
    mixed = _prompts(10)[8:] + _prompts(12, "hard", "h")[10:]  # easy 0.02, 0.02; hard 0.04, 0.04
    pool = Pool()
    by_bucket = RankedSelection(ByLength(True), PromptHistory(), pool, spares=1).pick(mixed, 0)
    assert pool.calls == [("easy", 2, 1, "select"), ("hard", 2, 1, "select")]
    # the pool's spares are single-digit questions (0.02 each), whatever the bucket asked
    assert by_bucket.flat_predicted == {"easy": pytest.approx(0.02), "hard": pytest.approx((2 * 0.04 + 2 * 0.02) / 4)}
    cold = RankedSelection(ByLength(False), PromptHistory(), Pool(), spares=1).pick(batch, 0)
    assert cold.flat_predicted is None
    assert not LearnedPredictor(warmup_groups=2).calibrated and not HistoryPredictor().calibrated
