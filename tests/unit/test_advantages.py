import math

import torch

from grpo_aug.algo import group_advantages


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
