"""Curriculum schedules at chosen steps, the adaptive difficulty, the bandit, sampler state and resume."""

import math

import pytest
from hydra.utils import instantiate

from grpo_aug.prompts.batch_sampler import CurriculumBatchSampler
from grpo_aug.prompts.curriculum import (
    AdaptiveSchedule,
    BanditSchedule,
    BucketStep,
    LinearSchedule,
    StagedSchedule,
    difficulty_weights,
)
from helpers import compose_cfg

INDICES = {"easy": list(range(0, 100)), "medium": list(range(100, 200)), "hard": list(range(200, 300))}


def one(bucket, reward, informative, predicted=None):
    """What a one-bucket step shows the schedule."""
    return {bucket: BucketStep(reward, informative, predicted)}


def test_staged_schedule_is_easy_heavy_first_then_moves_toward_hard(tmp_path):
    schedule = instantiate(compose_cfg(tmp_path, ["prompts/curriculum=staged"]).prompts.curriculum)
    total = 250
    early = [schedule.weights(s, total) for s in range(0, 50)]  # the first 20%
    assert all(w["easy"] >= 0.7 for w in early)
    hard = [schedule.weights(s, total)["hard"] for s in range(total)]
    assert hard == sorted(hard) and hard[-1] > hard[0]
    assert schedule.weights(49, total) == {"easy": 1.0, "medium": 0.0, "hard": 0.0}
    assert schedule.weights(50, total) == {"easy": 0.7, "medium": 0.2, "hard": 0.1}
    assert schedule.weights(249, total) == {"easy": 0.3, "medium": 0.3, "hard": 0.4}


def test_linear_schedule_by_hand():
    s = LinearSchedule(start={"easy": 1.0}, end={"easy": 0.2, "medium": 0.4, "hard": 0.4})
    assert s.weights(0, 11) == {"easy": 1.0, "medium": 0.0, "hard": 0.0}
    mid = s.weights(5, 11)  # halfway over steps 0..10
    assert mid == pytest.approx({"easy": 0.6, "medium": 0.2, "hard": 0.2})
    assert s.weights(10, 11) == pytest.approx({"easy": 0.2, "medium": 0.4, "hard": 0.4})
    with pytest.raises(ValueError, match="prompts.curriculum.end: weights must sum to 1"):
        LinearSchedule(start={"easy": 1.0}, end={"hard": 0.5})


def test_difficulty_weights_split_between_neighbours():
    assert difficulty_weights(0.0) == {"easy": 1.0, "medium": 0.0, "hard": 0.0}
    assert difficulty_weights(0.25) == {"easy": 0.75, "medium": 0.25, "hard": 0.0}
    assert difficulty_weights(1.5) == {"easy": 0.0, "medium": 0.5, "hard": 0.5}
    assert difficulty_weights(2.0) == {"easy": 0.0, "medium": 0.0, "hard": 1.0}


def test_adaptive_difficulty_follows_the_reward_with_a_two_step_lag():
    s = AdaptiveSchedule(target_success=0.5, step_size=0.1, sharpness=5.0)
    assert s.weights(0, 100)["easy"] == 1.0 and s.weights(1, 100)["easy"] == 1.0
    s.observe(0, one("easy", 0.9, 0.0))  # too easy: difficulty rises by 0.1 * tanh(5 * 0.4)
    up = 0.1 * math.tanh(2.0)
    assert s.weights(2, 100) == pytest.approx({"easy": 1 - up, "medium": up, "hard": 0.0})
    s.observe(1, one("medium", 0.1, 0.0))  # too hard: falls by the same amount, back to 0
    assert s.weights(3, 100) == pytest.approx({"easy": 1.0, "medium": 0.0, "hard": 0.0})
    s.observe(2, one("easy", 0.1, 0.0))  # clipped at 0
    assert s.difficulty_for(4) == 0.0
    with pytest.raises(RuntimeError, match="needs the reward of step 3"):
        s.weights(5, 100)
    for step in range(3, 200):
        s.observe(step, one("easy", 1.0, 0.0))
    assert s.difficulty_for(201) == 2.0  # saturates at hard


def test_adaptive_schedule_rejects_bad_values():
    with pytest.raises(ValueError, match="prompts.curriculum.target_success"):
        AdaptiveSchedule(target_success=1.5)


def _adaptive_sampler(start=0):
    return CurriculumBatchSampler(INDICES, 4, AdaptiveSchedule(step_size=0.5), 40, seed=3, start_step=start)


def _drive(sampler, rewards, steps, state_at=None, informative=None):
    """Iterate like Lightning does (the batch of step k is fetched before step k-1's reward).

    informative: bucket -> the share of informative groups its steps report (default 0.5)."""
    it = iter(sampler)
    batches, state = [], None
    pending = next(it)
    for k in range(steps):
        batch, pending = pending, next(it, None)
        batches.append([i for i, _ in batch])  # (record index, bucket) pairs
        step, bucket = sampler.start_step + k, batch[0][1]
        share = (informative or {}).get(bucket, 0.5)
        sampler.schedule.observe(step, one(bucket, rewards[step % len(rewards)], share))
        if state_at is not None and sampler.start_step + k + 1 == state_at:
            state = {**sampler.state_dict(), "next_step": state_at}
    return batches, state


def test_adaptive_resume_yields_exactly_the_uninterrupted_batches():
    rewards = [0.9, 0.8, 0.1, 0.95, 0.2, 0.7]
    full, state = _drive(_adaptive_sampler(), rewards, 30, state_at=12)
    assert len({b[0] // 100 for b in full}) > 1  # the difficulty really moved between buckets
    resumed = _adaptive_sampler()
    resumed.load_state_dict(state)
    tail, _ = _drive(resumed, rewards, 18)
    assert tail == full[12:]


def test_sampler_state_round_trip_and_seed_guard():
    a = CurriculumBatchSampler(INDICES, 4, StagedSchedule([{"until": 1.0, "weights": {"easy": 0.5, "hard": 0.5}}]),
                               30, seed=5)
    it = iter(a)
    first = [next(it) for _ in range(10)]
    b = CurriculumBatchSampler(INDICES, 4, a.schedule, 30, seed=5)
    b.load_state_dict(a.state_dict())
    assert list(b) == list(CurriculumBatchSampler(INDICES, 4, a.schedule, 30, seed=5))[10:]
    assert first == list(CurriculumBatchSampler(INDICES, 4, a.schedule, 30, seed=5))[:10]
    other = CurriculumBatchSampler(INDICES, 4, a.schedule, 30, seed=6)
    with pytest.raises(ValueError, match="data seed 5 differs"):
        other.load_state_dict(a.state_dict())


def test_rank_splits_are_disjoint_and_cover_the_step():
    world = 4
    samplers = [CurriculumBatchSampler(INDICES, 5, StagedSchedule([{"until": 1.0, "weights": {"easy": 0.4,
                "medium": 0.3, "hard": 0.3}}]), 25, seed=2, rank=r, world_size=world) for r in range(world)]
    single = CurriculumBatchSampler(INDICES, 20, samplers[0].schedule, 25, seed=2)
    for step in range(25):
        parts = [s.batch_at(step) for s in samplers]
        joined = [i for p in parts for i in p]
        assert len(set(joined)) == 20 and len({i // 100 for i in joined}) == 1
        assert sorted(joined) == sorted(single.batch_at(step))  # the ranks jointly hold the step's draw


def test_bandit_values_and_weights_by_hand():
    s = BanditSchedule(initial={"easy": 0.5}, temperature=0.1, rate=0.2, explore=0.06)
    # before any step: softmax(0.5, 0, 0 / 0.1) = e^5 : 1 : 1, then the 2% floor per bucket
    e5 = math.exp(5.0)
    expected = {"easy": 0.94 * e5 / (e5 + 2) + 0.02, "medium": 0.94 / (e5 + 2) + 0.02, "hard": 0.94 / (e5 + 2) + 0.02}
    assert s.weights(0, 100) == pytest.approx(expected) and s.weights(1, 100) == pytest.approx(expected)
    s.observe(0, one("easy", 0.7, 0.25))  # easy: 0.5 + 0.2 * (0.25 - 0.5) = 0.45
    s.observe(1, one("medium", 0.0, 1.0))  # medium: 0 + 0.2 * 1.0 = 0.2
    assert s.values_for(2) == pytest.approx({"easy": 0.45, "medium": 0.0, "hard": 0.0})
    assert s.values_for(3) == pytest.approx({"easy": 0.45, "medium": 0.2, "hard": 0.0})
    w = s.weights(3, 100)
    z = math.exp(0.0) + math.exp(-2.5) + math.exp(-4.5)  # values minus the top one (0.45), / 0.1
    assert w["medium"] == pytest.approx(0.94 * math.exp(-2.5) / z + 0.02)
    assert sum(w.values()) == pytest.approx(1.0)
    with pytest.raises(RuntimeError, match="needs the groups of step 2"):
        s.weights(4, 100)


def test_bandit_only_probes_a_bucket_whose_groups_are_all_flat():
    """Medium groups never have spread (the policy never solves one): after a few probes the
    bandit draws medium and hard at about the exploration floor (2% each), easy the rest."""
    sampler = CurriculumBatchSampler(INDICES, 4, BanditSchedule(initial={"easy": 0.5, "medium": 0.5, "hard": 0.5}),
                                     600, seed=1)
    batches, _ = _drive(sampler, [0.5], 600, informative={"easy": 0.6, "medium": 0.0, "hard": 0.0})
    late = [b[0] // 100 for b in batches[100:]]  # 0 easy, 1 medium, 2 hard
    assert late.count(1) + late.count(2) <= 0.08 * len(late)  # floor 4% + the softmax's 2 x 0.25%
    early = [b[0] // 100 for b in batches[:10]]
    assert 1 in early or 2 in early  # equal initial values: every bucket is tried at first


def test_bandit_moves_to_the_bucket_that_teaches():
    """Easy saturates (few groups with spread), medium has spread: the draw shifts to medium."""
    sampler = CurriculumBatchSampler(INDICES, 4, BanditSchedule(initial={"easy": 0.5}), 400, seed=2)
    batches, _ = _drive(sampler, [0.5], 400, informative={"easy": 0.1, "medium": 0.6, "hard": 0.0})
    late = [b[0] // 100 for b in batches[200:]]
    assert late.count(1) >= 0.85 * len(late)


def test_bandit_resume_yields_exactly_the_uninterrupted_batches():
    def make():
        return CurriculumBatchSampler(INDICES, 4, BanditSchedule(initial={"easy": 0.5, "medium": 0.4}), 60, seed=4)
    shares = {"easy": 0.3, "medium": 0.5, "hard": 0.1}
    full, state = _drive(make(), [0.5], 60, state_at=25, informative=shares)
    assert len({b[0] // 100 for b in full}) > 1
    resumed = make()
    resumed.load_state_dict(state)
    tail, _ = _drive(resumed, [0.5], 35, informative=shares)
    assert tail == full[25:]


def test_bandit_rejects_bad_values():
    with pytest.raises(ValueError, match="prompts.curriculum.initial: unknown bucket 'easyy'"):
        BanditSchedule(initial={"easyy": 0.5})
    with pytest.raises(ValueError, match="prompts.curriculum.explore must be in"):
        BanditSchedule(initial={"easy": 0.5}, explore=0.0)
    with pytest.raises(ValueError, match="prompts.curriculum.temperature must be > 0"):
        BanditSchedule(initial={"easy": 0.5}, temperature=0.0)


class _Recorder:
    def __init__(self):
        self.seen = []

    def weights(self, step, total):
        return {"easy": 0.2, "medium": 0.7, "hard": 0.1}

    def observe(self, step, seen):
        self.seen.append((step, seen))


class _Selection:  # the history and selector are tested on their own
    def observe(self, *args):
        pass


class _OtherRank:
    """A second rank: adds its own per-bucket totals (reward sum, scored rows, groups with spread,
    groups with a std, groups, predicted informative share, 1 if predicted) to the sum."""

    def __init__(self, totals):
        self.totals = totals

    def reduce(self, values, op):
        import torch

        assert op == "sum"
        return values + torch.tensor(self.totals, dtype=torch.float64)


def _feed_step(prompts, rewards, scored, flat_predicted, other_rank):
    from types import SimpleNamespace

    from grpo_aug.prompts import PromptFeed

    schedule = _Recorder()
    feed = PromptFeed(_Selection(), schedule, total_steps=10)
    feed.ranks = _OtherRank(other_rank)
    sampled = SimpleNamespace(prompts=prompts, rewards=rewards, scored=scored, valid=scored)
    values = feed.observe(SimpleNamespace(flat_predicted=flat_predicted), sampled, rollout_step=7, rows_per_prompt=4)
    return schedule.seen, values


def _prompt(bucket):
    from grpo_aug.data.records import Prompt

    return Prompt(bucket[0], "What is 2 + 3 * 4?", "p", "14", "", bucket)


def test_the_feed_gives_the_schedule_the_step_s_rank_pooled_reward_and_informative_share():
    import torch

    # three medium groups of 4; the third has one unscorable row (reward stored as 0, not counted)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    scored = torch.ones(3, 4, dtype=torch.bool)
    scored[2, 1] = False
    # the other rank: two medium groups, rewards summing to 2 over 8 rows, both with spread, and a
    # predicted informative share of 0.5
    other = [[0.0] * 7, [2.0, 8.0, 2.0, 2.0, 2.0, 0.5, 1.0], [0.0] * 7]
    # this rank's selector expects a quarter of its medium candidates flat
    seen, values = _feed_step([_prompt("medium")] * 3, rewards, scored, {"medium": 0.25}, other)
    # by hand: this rank's counted rewards 1+0+0+0 + 4 + 0+0+0 = 5 over 11 rows, one group of three
    # with spread; pooled: 7 / 19, 3 / 5; predicted: the ranks' mean (0.75 + 0.5) / 2
    assert seen == [(7, {"medium": BucketStep(pytest.approx(7 / 19), pytest.approx(3 / 5), pytest.approx(0.625), 1.0)})]
    assert values == {"curriculum/weight/easy": 0.2, "curriculum/weight/medium": 0.7,
                      "curriculum/weight/hard": 0.1, "curriculum/bucket": 1.0,
                      "curriculum/predicted_informative": pytest.approx(0.625)}


def test_the_feed_reports_each_bucket_of_a_mixed_step():
    import torch

    # this rank: two easy groups (one solved throughout, one with spread) and a hard group never solved
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    scored = torch.ones(3, 4, dtype=torch.bool)
    # the other rank: one hard group with spread, rewards summing to 1 over 4 rows; no prediction
    other = [[0.0] * 7, [0.0] * 7, [1.0, 4.0, 1.0, 1.0, 1.0, 0.0, 0.0]]
    seen, values = _feed_step([_prompt("easy"), _prompt("easy"), _prompt("hard")], rewards, scored, None, other)
    # by hand: easy 6 / 8 reward, 1 of 2 groups with spread, 2 of the step's 4 groups; hard 1 / 8,
    # 1 of 2, 2 of 4
    assert seen == [(7, {"easy": BucketStep(0.75, 0.5, None, 0.5), "hard": BucketStep(0.125, 0.5, None, 0.5)})]
    assert values["curriculum/bucket"] == 1.0  # half easy (0), half hard (2)
    assert "curriculum/predicted_informative" not in values
    bandit = BanditSchedule({"easy": 0.5, "medium": 0.5, "hard": 0.5}, rate=0.2)
    bandit.observe(0, seen[0][1])
    # each bucket moves by rate x its share: easy 0.5 + 0.1 * (0.5 - 0.5), hard the same; medium unseen
    assert bandit.values_for(2) == pytest.approx({"easy": 0.5, "medium": 0.5, "hard": 0.5})
    bandit.observe(1, {"easy": BucketStep(1.0, 1.0, None, 0.75), "hard": BucketStep(0.0, 0.0, None, 0.25)})
    # easy 0.5 + 0.2 * 0.75 * 0.5 = 0.575; hard 0.5 + 0.2 * 0.25 * (0 - 0.5) = 0.475
    assert bandit.values_for(3) == pytest.approx({"easy": 0.575, "medium": 0.5, "hard": 0.475})
    adaptive = AdaptiveSchedule(target_success=0.5, step_size=0.1, sharpness=5.0)
    adaptive.observe(0, {"easy": BucketStep(0.9, 0.0, None, 0.75), "hard": BucketStep(0.1, 0.0, None, 0.25)})
    # the step's reward over its groups: 0.75 * 0.9 + 0.25 * 0.1 = 0.7
    assert adaptive.difficulty_for(2) == pytest.approx(0.1 * math.tanh(5 * 0.2))


def test_the_bandit_can_value_a_bucket_by_the_predicted_share_of_its_candidates():
    s = BanditSchedule({"easy": 0.5, "medium": 0.5}, rate=0.2, predicted=True)
    s.observe(0, one("easy", 0.9, 1.0, 0.1))  # groups rolled out all informative, candidates 0.1
    s.observe(1, one("medium", 0.3, 0.5, None))  # no calibrated prediction yet: the groups' share
    # by hand: easy 0.5 + 0.2 * (0.1 - 0.5) = 0.42; medium 0.5 + 0.2 * (0.5 - 0.5) = 0.5
    assert s.values_for(3) == pytest.approx({"easy": 0.42, "medium": 0.5, "hard": 0.0})
    plain = BanditSchedule({"easy": 0.5, "medium": 0.5}, rate=0.2)
    plain.observe(0, one("easy", 0.9, 1.0, 0.1))  # off: the rolled-out groups' share, 0.5 + 0.2 * 0.5
    assert plain.values_for(2)["easy"] == pytest.approx(0.6)


def _counts_by_points(weights, n, u):
    """A second implementation: bucket k's slots are the points (u + k) / n inside its stretch of [0, 1)."""
    counts = dict.fromkeys(weights, 0)
    for k in range(n):
        point, low = (u + k) / n, 0.0
        for bucket, w in weights.items():
            if low <= point < low + w:
                counts[bucket] += 1
                break
            low += w
    return counts


def test_systematic_counts_by_hand_and_by_points():
    from grpo_aug.data.bucket_shares import spread_like, systematic_counts

    w = {"easy": 0.5, "medium": 0.3, "hard": 0.2}  # 8, 4.8, 3.2 of 16 slots
    assert systematic_counts(w, 16, 0.0) == {"easy": 8, "medium": 5, "hard": 3}
    assert systematic_counts(w, 16, 0.9) == {"easy": 8, "medium": 4, "hard": 4}
    for u in (0.0, 0.13, 0.5, 0.77, 0.999):
        for weights in (w, {"easy": 0.94 / 3 + 0.02, "medium": 0.02, "hard": 1 - 0.94 / 3 - 0.04},
                        {"easy": 0.0, "medium": 1.0, "hard": 0.0}):
            assert systematic_counts(weights, 16, u) == _counts_by_points(weights, 16, u)
    # over u, each bucket's mean count is its weight x slots
    grid = [systematic_counts(w, 16, (i + 0.5) / 1000) for i in range(1000)]
    assert {b: sum(c[b] for c in grid) / 1000 for b in w} == pytest.approx({"easy": 8, "medium": 4.8, "hard": 3.2})
    batch = [_prompt("easy")] * 3 + [_prompt("hard")]
    assert spread_like(batch, 8) == {"easy": 6, "hard": 2} and spread_like(batch[:1], 5) == {"easy": 5}


MIX = {"easy": 0.5, "medium": 0.3, "hard": 0.2}


def test_mixed_batches_hold_every_bucket_in_its_share_across_ranks():
    world = 2
    samplers = [CurriculumBatchSampler(INDICES, 8, StagedSchedule([{"until": 1.0, "weights": MIX}]), 40, seed=3,
                                       rank=r, world_size=world, mix=True) for r in range(world)]
    single = CurriculumBatchSampler(INDICES, 16, samplers[0].schedule, 40, seed=3, mix=True)
    mixed_ranks = 0
    for step in range(40):
        parts = [s.draw(step) for s in samplers]
        joined = [pair for part in parts for pair in part]
        assert len({i for i, _ in joined}) == 16 and sorted(joined) == sorted(single.draw(step))
        assert all(i // 100 == ["easy", "medium", "hard"].index(b) for i, b in joined)  # the record's own bucket
        counts = {b: sum(x == b for _, x in joined) for b in MIX}
        assert counts["easy"] == 8 and counts["medium"] in (4, 5) and counts["hard"] in (3, 4)
        mixed_ranks += all(len({b for _, b in part}) > 1 for part in parts)
    assert mixed_ranks >= 30  # shuffled before the ranks take their slices


def _drive_mixed(sampler, steps, state_at=None):
    """_drive for mixed batches: each bucket of a step reports its share of the groups (easy 0.2,
    medium 0.7, hard 0.4 informative). The state at `state_at` is saved as the datamodule saves
    it: with the cursors at the next step to train, though the sampler has already drawn it."""
    it, out, state = iter(sampler), [], None
    pending = next(it)
    for k in range(steps):
        batch, pending = pending, next(it, None)
        out.append(batch)
        buckets = [b for _, b in batch]
        sampler.schedule.observe(sampler.start_step + k, {
            b: BucketStep(0.5, {"easy": 0.2, "medium": 0.7, "hard": 0.4}[b], None, buckets.count(b) / len(buckets))
            for b in dict.fromkeys(buckets)})
        if state_at is not None and sampler.start_step + k + 1 == state_at:
            state = {**sampler.state_dict(), "next_step": state_at, "cursors": sampler.cursors_at(state_at)}
    return out, state


def test_mixed_bandit_resume_yields_exactly_the_uninterrupted_batches():
    def make():
        return CurriculumBatchSampler(INDICES, 6, BanditSchedule(initial={"easy": 0.5, "medium": 0.4}), 50, seed=4,
                                      mix=True)

    full, state = _drive_mixed(make(), 50, state_at=20)
    resumed = make()
    resumed.load_state_dict(state)
    assert _drive_mixed(resumed, 30)[0] == full[20:]
    late = [b for batch in full[30:] for _, b in batch]
    assert late.count("medium") > 0.6 * len(late)  # the bucket that teaches holds most of each batch


def test_a_mixed_bucket_short_of_its_count_passes_the_rest_to_its_nearest():
    schedule = StagedSchedule([{"until": 1.0, "weights": {"medium": 0.5, "hard": 0.5}}])
    moved = {"easy": [0, 1, 2, 3, 4, 5], "medium": [6], "hard": [7, 8, 9, 10, 11]}  # medium emptied to 1
    sampler = CurriculumBatchSampler(INDICES, 8, schedule, 10, buckets_at=lambda step: moved, mix=True)
    drawn = sampler.draw(0)
    buckets = [b for _, b in drawn]
    # 4 medium asked, 1 there; 3 pass on, easy first (hard, as near, holds its own 4 of its 5)
    assert (buckets.count("medium"), buckets.count("easy"), buckets.count("hard")) == (1, 3, 4)
    assert all(i in moved[b] for i, b in drawn) and len({i for i, _ in drawn}) == 8


def _counts_spread(drawn, bucket):
    """max - min of how often each prompt of the bucket was drawn."""
    counts = [sum(i == j for j, b in drawn if b == bucket) for i in INDICES[bucket]]
    return max(counts) - min(counts)


def test_without_replacement_every_prompt_comes_once_per_pass():
    uniform = StagedSchedule([{"until": 1.0, "weights": {"easy": 0.34, "medium": 0.33, "hard": 0.33}}])
    sampler = CurriculumBatchSampler(INDICES, 10, uniform, 60, seed=1, mix=True, without_replacement=True)
    steps = list(sampler)  # 600 draws, ~200 per bucket of 100
    drawn = [pair for batch in steps for pair in batch]
    for b in ("easy", "medium", "hard"):
        first, seen = [], 0
        for batch in steps:  # the steps whose draws all fall in the first pass
            mine = [i for i, x in batch if x == b]
            if seen + len(mine) > 100:
                break
            first += mine
            seen += len(mine)
        assert len(first) > 90 and len(set(first)) == len(first)  # no prompt twice within a pass
        # ~2 passes: every prompt twice, give or take one where a step spans two passes
        assert _counts_spread(drawn, b) <= 2
    # at random, the same draws leave prompts out and repeat others
    at_random = [pair for batch in CurriculumBatchSampler(INDICES, 10, uniform, 60, seed=1, mix=True) for pair in batch]
    assert all(_counts_spread(at_random, b) >= 4 for b in ("easy", "medium", "hard"))


def test_without_replacement_one_bucket_steps_and_ranks():
    schedule = StagedSchedule([{"until": 1.0, "weights": {"easy": 0.5, "hard": 0.5}}])
    ranks = [CurriculumBatchSampler(INDICES, 4, schedule, 50, seed=2, rank=r, world_size=2, without_replacement=True)
             for r in range(2)]
    steps = [a + b for a, b in zip(ranks[0], ranks[1], strict=True)]
    assert all(len({i for i, _ in step}) == 8 and len({b for _, b in step}) == 1 for step in steps)
    easy = [i for step in steps for i, b in step if b == "easy"]
    assert len(easy) >= 100 and sorted(easy[:100]) == INDICES["easy"]


def test_without_replacement_resumes_where_the_passes_stood():
    def make():
        return CurriculumBatchSampler(INDICES, 6, BanditSchedule(initial={"easy": 0.5, "medium": 0.4}), 80, seed=4,
                                      mix=True, without_replacement=True)

    full, state = _drive_mixed(make(), 80, state_at=30)
    resumed = make()
    resumed.load_state_dict(state)
    assert _drive_mixed(resumed, 50)[0] == full[30:]
    with pytest.raises(ValueError, match="saved without it"):
        make().load_state_dict({**state, "cursors": None})
