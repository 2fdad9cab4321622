"""Max-variance down-sampling against brute force over every subset."""

import itertools
import random
import statistics

import torch

from grpo_aug.rollout.downsample import max_variance_rows, max_variance_subset


def test_matches_brute_force_on_small_groups():
    rng = random.Random(0)
    for _ in range(300):
        size, keep = rng.randint(3, 8), rng.randint(2, 4)
        keep = min(keep, size - 1)
        rewards = [rng.choice([0.0, 0.5, 1.0, rng.random()]) for _ in range(size)]
        counted = [True] * size
        distinct = [rng.random() < 0.7 for _ in range(size)]
        chosen = max_variance_rows(rewards, counted, distinct, keep)
        assert len(chosen) == keep == len(set(chosen))
        best = max(statistics.pvariance([rewards[i] for i in c]) for c in itertools.combinations(range(size), keep))
        assert abs(statistics.pvariance([rewards[i] for i in chosen]) - best) < 1e-12
        # among the subsets of largest variance, none has more distinct rows
        most = max(sum(distinct[i] for i in c) for c in itertools.combinations(range(size), keep)
                   if abs(statistics.pvariance([rewards[i] for i in c]) - best) < 1e-12)
        assert sum(distinct[i] for i in chosen) == most


def test_binary_rewards_keep_a_balanced_group():
    rewards = [0.0] * 12 + [1.0] * 4  # 4 right of 16 rows
    chosen = max_variance_rows(rewards, [True] * 16, [True] * 16, 8)
    assert sorted(rewards[i] for i in chosen) == [0.0] * 4 + [1.0] * 4


def test_only_counted_rows_compete_and_short_groups_are_filled():
    rewards = [5.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    counted = [False, True, True, True, True, True]  # row 0 is unscorable: its 5.0 must not win
    assert 0 not in max_variance_rows(rewards, counted, [True] * 6, 4)
    assert max_variance_rows([0.0, 1.0, 0.0, 1.0], [True, False, False, True], [True] * 4, 3) == [0, 1, 3]


def test_batched_indices():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    ones = torch.ones(2, 4, dtype=torch.bool)
    keep = max_variance_subset(rewards, ones, ones, 2)
    assert keep.shape == (2, 2)
    assert sorted(rewards[0, keep[0]].tolist()) == [0.0, 1.0] and sorted(rewards[1, keep[1]].tolist()) == [0.0, 1.0]
