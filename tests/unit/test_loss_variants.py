"""GSPO's sequence ratio, verl's dual clip and the entropy bonus against per-token Python loops."""

import math

import pytest
import torch

from grpo_aug.algo.aggregate import RowMean, TokenMean
from grpo_aug.algo.loss import policy_loss
from grpo_aug.algo.ratio import SequenceRatio


def _random(seed, rows=6, T=5):
    g = torch.Generator().manual_seed(seed)
    logps = (-torch.rand(rows, T, generator=g) * 3).requires_grad_()
    old = logps.detach() + torch.randn(rows, T, generator=g) * 0.5  # ratios far from 1: clips engage
    ref = logps.detach() + torch.randn(rows, T, generator=g) * 0.3
    adv = torch.randn(rows, generator=g)
    mask = (torch.rand(rows, T, generator=g) > 0.25).float()
    mask[0] = 0.0  # a fully masked row
    return logps, old, ref, adv, mask


def _naive(logps, old, ref, adv, mask, beta, lo, hi, sequence=False, c=None, entropy=None, coef=0.0):
    """-(row mean of per-token objective), then mean over rows; every term by hand, per token."""
    rows, T = logps.shape
    total = 0.0
    for i in range(rows):
        n = sum(float(mask[i, t]) for t in range(T))
        if sequence:
            s = sum((logps[i, t] - old[i, t]) * mask[i, t] for t in range(T)) / max(n, 1.0)
        row = 0.0
        for t in range(T):
            if mask[i, t] == 0:
                continue
            r = torch.exp(s if sequence else logps[i, t] - old[i, t])
            a = float(adv[i])
            obj = torch.minimum(r * a, torch.clamp(r, 1 - lo, 1 + hi) * a)
            if c is not None and a < 0:  # verl: loss = min(max(-A r, -A clip(r)), -A c) when A < 0
                obj = torch.maximum(obj, torch.tensor(c * a))
            d = ref[i, t] - logps[i, t]
            obj = obj - beta * (torch.exp(d) - d - 1)
            if entropy is not None:
                obj = obj + coef * entropy[i, t]
            row = row + obj
        total = total + row / max(n, 1.0)
    return -total / rows


@pytest.mark.parametrize("seed", range(4))
def test_sequence_ratio_matches_gspo_by_hand_value_and_gradient(seed):
    logps, old, ref, adv, mask = _random(seed)
    loss, _ = policy_loss(logps, ref, old, adv, mask, beta=0.04, clip_eps_low=0.1, clip_eps_high=0.15,
                          ratio=SequenceRatio())
    (grad,) = torch.autograd.grad(loss, logps)
    expected = _naive(logps, old, ref, adv, mask, 0.04, 0.1, 0.15, sequence=True)
    (grad_expected,) = torch.autograd.grad(expected, logps)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)
    assert torch.allclose(grad, grad_expected, atol=1e-6)


def test_sequence_ratio_clips_whole_rows():
    logps = torch.zeros(2, 3)
    old = torch.tensor([[-1.0, 0.0, -0.5], [0.1, -0.1, 0.0]])  # row 0: mean log-ratio 0.5 (clipped)
    adv = torch.tensor([1.0, 1.0])
    _, stats = policy_loss(logps, None, old, adv, torch.ones(2, 3), beta=0.0, ratio=SequenceRatio())
    assert stats.clip_frac_high.item() == pytest.approx(3 / 6)  # every token of row 0, none of row 1
    assert stats.ratio_max.item() == pytest.approx(math.exp(0.5), rel=1e-6)


def test_sequence_ratio_is_the_geometric_mean_of_the_token_ratios():
    log_ratio = torch.tensor([[0.2, -0.4, 1.0], [0.3, 0.3, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = SequenceRatio()(log_ratio, mask)
    assert out.shape == (2, 1)
    assert out[:, 0].tolist() == pytest.approx([math.log(math.sqrt(math.exp(0.2) * math.exp(-0.4))), 0.3])


@pytest.mark.parametrize("seed", range(4))
def test_dual_clip_matches_verl_formula_by_hand(seed):
    logps, old, ref, adv, mask = _random(seed)
    old = old - 1.5  # ratios up to ~e^3: negative advantages cross the dual clip at c = 3
    loss, stats = policy_loss(logps, ref, old, adv, mask, beta=0.04, clip_ratio_c=3.0)
    (grad,) = torch.autograd.grad(loss, logps)
    expected = _naive(logps, old, ref, adv, mask, 0.04, 0.2, 0.2, c=3.0)
    (grad_expected,) = torch.autograd.grad(expected, logps)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)
    assert torch.allclose(grad, grad_expected, atol=1e-6)
    ratio = torch.exp(logps.detach() - old)
    bound = ((ratio > 3.0) & (adv[:, None] < 0) & (mask > 0)).sum() / mask.sum()
    assert stats.clip_frac_dual.item() == pytest.approx(bound.item()) and bound > 0


def test_dual_clip_bounds_a_huge_ratio_and_stops_its_gradient():
    logps = torch.zeros(1, 1, requires_grad=True)
    old = torch.full((1, 1), -5.0)  # ratio e^5 ~ 148
    loss, _ = policy_loss(logps, None, old, torch.tensor([-1.0]), torch.ones(1, 1), beta=0.0, clip_ratio_c=3.0)
    loss.backward()
    assert loss.item() == pytest.approx(3.0)  # -(c * A) with A = -1
    assert logps.grad.item() == 0.0


def _entropy_by_hand(logits):
    rows, T, V = logits.shape
    out = torch.zeros(rows, T)
    for i in range(rows):
        for t in range(T):
            z = logits[i, t]
            p = [math.exp(float(z[v])) for v in range(V)]
            total = sum(p)
            out[i, t] = -sum(q / total * math.log(q / total) for q in p)
    return out


def test_entropy_bonus_adds_coef_times_the_masked_mean_entropy():
    from grpo_aug.fast_llama.logprobs import token_logprobs

    class Toy(torch.nn.Module):  # logits straight from a table: the entropy has a known gradient
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(1, 6, 5, generator=torch.Generator().manual_seed(0)))

        def forward(self, input_ids, attention_mask=None, position_ids=None, logits_to_keep=0, **kw):
            return type("Out", (), {"logits": self.table.expand(len(input_ids), -1, -1)[:, -logits_to_keep:]})

    model = Toy()
    ids = torch.tensor([[0, 1, 2, 3, 4, 0], [0, 1, 4, 4, 2, 1]])
    logps, ent = token_logprobs(model, ids, torch.ones_like(ids), 2, torch.ones(2), with_entropy=True,
                                entropy_grad=True)
    assert ent.requires_grad
    assert torch.allclose(ent, _entropy_by_hand(model.table.detach()[:, 1:5].expand(2, -1, -1)), atol=1e-5)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    adv = torch.tensor([0.5, -0.5])
    with_bonus, _ = policy_loss(logps, None, logps.detach(), adv, mask, beta=0.0, aggregate=TokenMean(),
                                entropy=ent, entropy_coef=0.01)
    without, _ = policy_loss(logps, None, logps.detach(), adv, mask, beta=0.0, aggregate=TokenMean())
    assert (with_bonus - without).item() == pytest.approx(-0.01 * ((ent * mask).sum() / mask.sum()).item(), rel=1e-5)
    model.zero_grad()
    (with_bonus - without).backward()
    assert model.table.grad.abs().sum() > 0  # the bonus pushes the logits toward spread-out distributions


def test_no_reference_is_the_same_loss_as_beta_zero():
    logps, old, ref, adv, mask = _random(7)
    a, _ = policy_loss(logps, ref, old, adv, mask, beta=0.0, aggregate=RowMean())
    b, stats = policy_loss(logps, None, old, adv, mask, beta=0.0, aggregate=RowMean())
    assert a.item() == b.item()
    assert stats.kl_mean.item() == 0.0
