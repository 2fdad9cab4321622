import math

import torch

from grpo_aug.algo import LOG_RATIO_BOUND, group_advantages, k3_kl, policy_loss
from grpo_aug.algo.loss import LossStats


def grpo_loss(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    old_logps: torch.Tensor,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.04,
    clip_eps: float = 0.2,
    adv_clip: float = 10.0,
) -> tuple[torch.Tensor, LossStats]:
    """GRPO's scalar form: logps/ref_logps/old_logps/mask [B, G, T], rewards [B, G] -> (loss, detached
    stats)."""
    adv = group_advantages(rewards, adv_clip=adv_clip)  # [B, G]
    return policy_loss(logps, ref_logps, old_logps, adv, mask, beta=beta, clip_eps_low=clip_eps,
                       clip_eps_high=clip_eps)


def _k3(logp: float, ref: float) -> float:
    d = ref - logp
    return math.exp(d) - d - 1


def test_zero_std_group_loss_is_pure_kl():
    logps = torch.tensor([[[-1.0, -2.0], [-0.5, -0.5]]])  # [1, 2, 2]
    ref = torch.tensor([[[-1.5, -1.0], [-0.5, -1.0]]])
    mask = torch.ones(1, 2, 2)
    rewards = torch.tensor([[1.0, 1.0]])
    loss, _ = grpo_loss(logps, ref, logps.detach(), rewards, mask, beta=0.1)
    row0 = (_k3(-1.0, -1.5) + _k3(-2.0, -1.0)) / 2
    row1 = (_k3(-0.5, -0.5) + _k3(-0.5, -1.0)) / 2
    assert math.isclose(loss.item(), 0.1 * (row0 + row1) / 2, rel_tol=1e-6)


def test_first_iteration_ratio_is_one_and_loss_is_minus_mean_advantage():
    logps = torch.randn(2, 4, 5)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]])
    loss, stats = grpo_loss(logps, logps, logps.detach(), rewards, torch.ones(2, 4, 5), beta=0.04)
    assert stats.ratio_mean.item() == 1.0
    assert stats.clip_frac.item() == 0.0
    assert stats.kl_mean.item() == 0.0
    # ratio 1, KL 0: loss = -mean(advantages); group advantages sum to 0 -> loss 0
    assert abs(loss.item()) < 1e-6


def test_all_masked_row_contributes_zero_and_is_finite():
    logps = torch.full((1, 2, 3), -1.0, requires_grad=True)
    old = torch.full((1, 2, 3), -1.0)
    mask = torch.tensor([[[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]])
    rewards = torch.tensor([[1.0, 0.0]])
    loss, _ = grpo_loss(logps, old, old, rewards, mask)
    # adv = [+1/sqrt(2), -1/sqrt(2)] (std of {1, 0} is sqrt(0.5)); row 1 is fully masked -> 0
    adv0 = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert math.isclose(loss.item(), -(adv0 + 0.0) / 2, rel_tol=1e-6)
    loss.backward()
    assert torch.isfinite(logps.grad).all()
    assert torch.equal(logps.grad[0, 1], torch.zeros(3))


def test_extreme_log_ratio_is_clamped_and_finite():
    logps = torch.tensor([[[0.0], [0.0]]], requires_grad=True)
    ref = torch.tensor([[[-500.0], [500.0]]])
    old = torch.tensor([[[-300.0], [300.0]]])
    loss, _ = grpo_loss(logps, ref, old, torch.tensor([[1.0, 0.0]]), torch.ones(1, 2, 1), beta=0.04)
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(logps.grad).all()
    kl = k3_kl(torch.zeros(2), torch.tensor([1e4, -1e4]), LOG_RATIO_BOUND)
    b = LOG_RATIO_BOUND
    assert torch.allclose(kl, torch.tensor([math.exp(b) - b - 1, math.exp(-b) + b - 1]))


def test_clipping_active_on_both_sides():
    # group of 2: rewards 1, 0 -> advantages +a, -a with a = 0.5 / sqrt(0.5) = 0.7071
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    eps = 0.2
    old = torch.zeros(1, 2, 2)
    # row 0 (A > 0): ratios e^0.5 = 1.65 (clipped at 1.2) and e^-0.1 = 0.905 (not clipped)
    # row 1 (A < 0): ratios e^-0.5 = 0.607 (clipped at 0.8) and e^0.1 = 1.105 (not clipped)
    logps = torch.tensor([[[0.5, -0.1], [-0.5, 0.1]]])
    loss, stats = grpo_loss(logps, logps, old, torch.tensor([[1.0, 0.0]]), torch.ones(1, 2, 2), beta=0.0,
                            clip_eps=eps)
    row0 = (1.2 * a + math.exp(-0.1) * a) / 2  # min(1.65a, 1.2a) = 1.2a; 0.905 is inside the clip range
    row1 = (0.8 * -a + math.exp(0.1) * -a) / 2  # min(-0.607a, -0.8a) = -0.8a
    assert math.isclose(loss.item(), -(row0 + row1) / 2, rel_tol=1e-5)
    assert math.isclose(stats.clip_frac.item(), 0.5)
    # clipped tokens carry no gradient
    logps.requires_grad_(True)
    grpo_loss(logps, logps.detach(), old, torch.tensor([[1.0, 0.0]]), torch.ones(1, 2, 2), beta=0.0)[0].backward()
    assert logps.grad[0, 0, 0] == 0 and logps.grad[0, 1, 0] == 0
    assert logps.grad[0, 0, 1] != 0 and logps.grad[0, 1, 1] != 0
