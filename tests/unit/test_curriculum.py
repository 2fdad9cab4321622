"""Curriculum schedules at chosen steps, the adaptive difficulty, sampler state and resume."""

import math

import pytest
from hydra.utils import instantiate

from grpo_aug.data.curriculum import AdaptiveSchedule, LinearSchedule, StagedSchedule, difficulty_weights
from grpo_aug.data.sampler import CurriculumBatchSampler
from helpers import compose_cfg

INDICES = {"easy": list(range(0, 100)), "medium": list(range(100, 200)), "hard": list(range(200, 300))}


def test_staged_schedule_is_easy_heavy_first_then_moves_toward_hard(tmp_path):
    schedule = instantiate(compose_cfg(tmp_path, ["curriculum=staged"]).curriculum)
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
    with pytest.raises(ValueError, match="curriculum.end: weights must sum to 1"):
        LinearSchedule(start={"easy": 1.0}, end={"hard": 0.5})


def test_difficulty_weights_split_between_neighbours():
    assert difficulty_weights(0.0) == {"easy": 1.0, "medium": 0.0, "hard": 0.0}
    assert difficulty_weights(0.25) == {"easy": 0.75, "medium": 0.25, "hard": 0.0}
    assert difficulty_weights(1.5) == {"easy": 0.0, "medium": 0.5, "hard": 0.5}
    assert difficulty_weights(2.0) == {"easy": 0.0, "medium": 0.0, "hard": 1.0}


def test_adaptive_difficulty_follows_the_reward_with_a_two_step_lag():
    s = AdaptiveSchedule(target_success=0.5, step_size=0.1, sharpness=5.0)
    assert s.weights(0, 100)["easy"] == 1.0 and s.weights(1, 100)["easy"] == 1.0
    s.observe(0, 0.9)  # too easy: difficulty rises by 0.1 * tanh(5 * 0.4)
    up = 0.1 * math.tanh(2.0)
    assert s.weights(2, 100) == pytest.approx({"easy": 1 - up, "medium": up, "hard": 0.0})
    s.observe(1, 0.1)  # too hard: falls by the same amount, back to 0
    assert s.weights(3, 100) == pytest.approx({"easy": 1.0, "medium": 0.0, "hard": 0.0})
    s.observe(2, 0.1)  # clipped at 0
    assert s.difficulty_for(4) == 0.0
    with pytest.raises(RuntimeError, match="needs the reward of step 3"):
        s.weights(5, 100)
    for step in range(3, 200):
        s.observe(step, 1.0)
    assert s.difficulty_for(201) == 2.0  # saturates at hard


def test_adaptive_schedule_rejects_bad_values():
    with pytest.raises(ValueError, match="curriculum.target_success"):
        AdaptiveSchedule(target_success=1.5)


def _adaptive_sampler(start=0):
    return CurriculumBatchSampler(INDICES, 4, AdaptiveSchedule(step_size=0.5), 40, seed=3, start_step=start)


def _drive(sampler, rewards, steps, state_at=None):
    """Iterate like Lightning does (the batch of step k is fetched before step k-1's reward)."""
    it = iter(sampler)
    batches, state = [], None
    pending = next(it)
    for k in range(steps):
        batch, pending = pending, next(it, None)
        batches.append([i for i, _ in batch])  # (record index, bucket) pairs
        sampler.schedule.observe(sampler.start_step + k, rewards[(sampler.start_step + k) % len(rewards)])
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
