import math
import statistics

import pytest
import torch

from grpo_aug.algo import group_advantages
from grpo_aug.algo.advantages import BatchScale, GroupScale, NoScale, batch_reward_std
from grpo_aug.algo.group_stats import group_stats, informative_share


def test_one_correct_of_four_by_hand():
    # mean 0.25; unbiased var = (0.75^2 + 3 * 0.25^2) / 3 = 0.25 -> std 0.5
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), eps=0.0)
    assert torch.allclose(adv, torch.tensor([[1.5, -0.5, -0.5, -0.5]]))


def test_zero_std_group_gets_zero_advantage():
    adv = group_advantages(torch.tensor([[0.7, 0.7, 0.7], [1.0, 2.0, 3.0]]))
    assert torch.equal(adv[0], torch.zeros(3))
    # second group: mean 2, std 1 -> -1, 0, 1 (eps 1e-6 shrinks it by ~1e-6)
    assert torch.allclose(adv[1], torch.tensor([-1.0, 0.0, 1.0]), atol=1e-5)


def test_advantage_clip():
    rewards = torch.tensor([[100.0] + [0.0] * 15])
    # unclipped: mean 6.25, std = sqrt((93.75^2 + 15 * 6.25^2) / 15) = 25 -> 93.75 / 25 = 3.75
    assert math.isclose(group_advantages(rewards, adv_clip=10.0)[0, 0].item(), 3.75, rel_tol=1e-5)
    assert math.isclose(group_advantages(rewards, adv_clip=2.0)[0, 0].item(), 2.0, rel_tol=1e-6)


def test_invalid_rows_are_left_out_of_statistics():
    rewards = torch.tensor([[1.0, 0.0, 50.0, 0.0]])
    valid = torch.tensor([[True, True, False, True]])
    # valid rows 1, 0, 0: mean 1/3, var = ((2/3)^2 + 2 (1/3)^2) / 2 = 1/3
    std = math.sqrt(1 / 3)
    expected = torch.tensor([[(2 / 3) / std, -(1 / 3) / std, 0.0, -(1 / 3) / std]])
    assert torch.allclose(group_advantages(rewards, valid, eps=0.0), expected, atol=1e-6)


def test_group_with_one_valid_row_has_no_signal():
    valid = torch.tensor([[True, False, False]])
    assert torch.equal(group_advantages(torch.tensor([[1.0, 0.0, 0.0]]), valid), torch.zeros(1, 3))


@pytest.mark.parametrize("value", [0.3, 0.8, 2.3, 77.7, 16.1, -0.1])
@pytest.mark.parametrize("group_size", [2, 3, 16, 64])
def test_flat_groups_get_exactly_zero_whatever_the_value(value, group_size):
    rewards = torch.full((3, group_size), value)
    rewards[1, 0] = 5.0  # a near-copy with another reward does not count: group 1 is flat too
    valid = torch.ones(3, group_size, dtype=torch.bool)
    valid[1, 0] = False
    for scale, std in ((GroupScale(), None), (NoScale(), None), (BatchScale(), torch.tensor(0.4))):
        adv = group_advantages(rewards, valid, scale=scale, batch_std=std)
        assert torch.equal(adv[[0, 2]], torch.zeros(2, group_size))
        assert torch.equal(adv[1], torch.zeros(group_size))


def test_group_stats_match_pythons_statistics_on_random_groups():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(50, 16, generator=gen) * 3  # float32, as the module holds them
    valid = torch.rand(50, 16, generator=gen) > 0.3
    stats = group_stats(rewards, valid)
    adv = group_advantages(rewards, valid, eps=0.0)
    for b in range(50):
        rows = [float(x) for x, v in zip(rewards[b].tolist(), valid[b].tolist(), strict=True) if v]
        assert int(stats.count[b]) == len(rows)
        if len(rows) < 2:
            assert not stats.informative[b] and torch.equal(adv[b], torch.zeros(16))
            continue
        mean, std = statistics.fmean(rows), statistics.stdev(rows)
        assert stats.mean[b].item() == pytest.approx(mean, rel=1e-12)
        assert stats.std[b].item() == pytest.approx(std, rel=1e-12)
        expected = [(r - mean) / std if v else 0.0 for r, v in zip(rewards[b].tolist(), valid[b].tolist(), strict=True)]
        assert adv[b].tolist() == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_informative_share_counts_groups_with_spread_among_those_with_a_std():
    rewards = torch.tensor([[1.0, 0.0, 1.0], [0.3, 0.3, 0.3], [2.0, 5.0, 5.0], [1.0, 0.0, 0.0]])
    counted = torch.tensor([[True, True, True], [True, True, True], [False, True, True], [True, False, False]])
    # group 0 spread; 1 flat; 2 flat among its counted rows (5, 5); 3 has one counted row: no std
    assert informative_share(rewards, counted).item() == pytest.approx(1 / 3)
    assert informative_share(rewards[3:], counted[3:]).item() == 0.0


def trl_advantages(rewards: torch.Tensor, G: int, scale_rewards: str, eps: float) -> torch.Tensor:
    """TRL GRPOTrainer's formula (trl/trainer/grpo_trainer.py, _generate_and_score_completions), written
    out again here: rewards [B*G] flat; eps is TRL's 1e-4 there, ours 1e-6 (passed in)."""
    mean = rewards.view(-1, G).mean(dim=1).repeat_interleave(G)
    if scale_rewards == "batch":
        std = rewards.std().expand_as(rewards)
    else:
        std = rewards.view(-1, G).std(dim=1).repeat_interleave(G)
    adv = rewards - mean
    return adv if scale_rewards == "none" else adv / (std + eps)


@pytest.mark.parametrize("name,scale", [("group", GroupScale()), ("batch", BatchScale()), ("none", NoScale())])
def test_scale_rewards_match_trls_formula(name, scale):
    gen = torch.Generator().manual_seed(3)
    rewards = torch.rand(6, 8, generator=gen, dtype=torch.float64).round(decimals=1)  # [B, G]
    rewards[2] = 0.5  # a flat group: TRL gives it 0 / (0 + eps) = 0 too, and it counts in the batch std
    std = batch_reward_std(rewards, torch.ones_like(rewards, dtype=torch.bool))
    ours = group_advantages(rewards, adv_clip=1e9, scale=scale, batch_std=std)
    theirs = trl_advantages(rewards.reshape(-1), 8, name, 1e-6).view(6, 8)
    assert torch.allclose(ours, theirs, atol=1e-9)


def test_batch_std_by_hand_and_pooled_over_ranks():
    # rewards 1, 0, 0, 1 and a left-out 50: mean 0.5, unbiased var = 4 * 0.25 / 3 = 1/3
    rewards = torch.tensor([[1.0, 0.0, 50.0], [0.0, 1.0, 0.0]])
    counted = torch.tensor([[True, True, False], [True, True, False]])
    assert math.isclose(batch_reward_std(rewards, counted).item(), math.sqrt(1 / 3), rel_tol=1e-12)
    # two "ranks" with one group each: the pooled std is the std of all four rewards
    rank0, rank1 = (rewards[:1], counted[:1]), (rewards[1:], counted[1:])
    other = torch.tensor([2.0, 1.0, 1.0], dtype=torch.float64)  # rank 1's count, sum, sum of squares
    assert math.isclose(batch_reward_std(*rank0, reduce_sum=lambda m: m + other).item(), math.sqrt(1 / 3),
                        rel_tol=1e-12)
    assert batch_reward_std(*rank1, reduce_sum=None).item() == pytest.approx(math.sqrt(0.5))
    assert batch_reward_std(torch.tensor([3.0]), torch.tensor([True])).item() == 0.0
