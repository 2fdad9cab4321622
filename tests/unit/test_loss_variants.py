"""Loss aggregation variants, KL estimators and clip-higher against a plain-Python implementation."""

import math

import pytest
import torch

from grpo_aug.algo.aggregate import ConstantNorm, RowMean, TokenMean
from grpo_aug.algo.kl import KL_ESTIMATORS, k1_kl, k2_kl, k3_kl
from grpo_aug.algo.loss import LOG_RATIO_BOUND, policy_loss


def naive_loss(logps, ref, old, adv, mask, beta, low, high, kl, variant, constant=None):
    """Loops over rows and tokens with Python floats: the textbook formulas, nothing shared."""
    rows = []
    for r in range(len(logps)):
        terms = []
        for t in range(len(logps[r])):
            if not mask[r][t]:
                continue
            ratio = math.exp(logps[r][t] - old[r][t])
            clipped = min(max(ratio, 1 - low), 1 + high)
            d = ref[r][t] - logps[r][t]
            k = {"k1": -d, "k2": d * d / 2, "k3": math.exp(d) - d - 1}[kl]
            terms.append(min(ratio * adv[r], clipped * adv[r]) - beta * k)
        rows.append(terms)
    if variant == "row_mean":
        return -sum(sum(t) / max(len(t), 1) for t in rows) / len(rows)
    if variant == "token_mean":
        return -sum(sum(t) for t in rows) / max(sum(len(t) for t in rows), 1)
    return -sum(sum(t) for t in rows) / (len(rows) * constant)


def _case(seed=0):
    g = torch.Generator().manual_seed(seed)
    R, T = 5, 6
    logps = -torch.rand(R, T, generator=g) * 3
    old = logps + (torch.rand(R, T, generator=g) - 0.5) * 0.8  # ratios between e^-0.4 and e^0.4
    ref = logps + (torch.rand(R, T, generator=g) - 0.5)
    adv = torch.tensor([1.2, -0.7, 0.0, 2.0, -1.5])
    mask = torch.ones(R, T)
    mask[0, 4:] = 0  # rows of different lengths
    mask[3, 1:] = 0
    mask[4] = 0  # an all-masked row
    return logps, ref, old, adv, mask


@pytest.mark.parametrize("variant, aggregate", [("row_mean", RowMean()), ("token_mean", TokenMean()),
                                                ("constant_norm", ConstantNorm(8))])
@pytest.mark.parametrize("kl", ["k1", "k2", "k3"])
def test_variants_match_naive(variant, aggregate, kl):
    logps, ref, old, adv, mask = _case()
    loss, _ = policy_loss(logps, ref, old, adv, mask, beta=0.05, clip_eps_low=0.2, clip_eps_high=0.28,
                          kl=KL_ESTIMATORS[kl], aggregate=aggregate)
    expected = naive_loss(logps.tolist(), ref.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 0.05, 0.2,
                          0.28, kl, variant, constant=8)
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([math.log(0.25)]), torch.tensor([math.log(0.5)])  # d = ln 2
    d = math.log(2)
    assert k1_kl(logp, ref, 20).item() == pytest.approx(-d)
    assert k2_kl(logp, ref, 20).item() == pytest.approx(d * d / 2)
    assert k3_kl(logp, ref, 20).item() == pytest.approx(2 - d - 1)


def test_variants_weigh_lengths_differently():
    # row 0: 1 token with term 1; row 1: 3 tokens with term 0 (adv 0), no clipping, beta 0
    logps = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1]])
    adv = torch.tensor([1.0, 0.0])
    args = (logps, logps, logps, adv, mask)
    assert policy_loss(*args, beta=0, aggregate=RowMean())[0].item() == pytest.approx(-(1 + 0) / 2)
    assert policy_loss(*args, beta=0, aggregate=TokenMean())[0].item() == pytest.approx(-1 / 4)
    assert policy_loss(*args, beta=0, aggregate=ConstantNorm(10))[0].item() == pytest.approx(-1 / 20)


def test_clip_higher_and_clip_fractions():
    old = torch.zeros(2, 2)
    # row 0 (A > 0): ratios 1.25 and 1.35; row 1 (A < 0): ratios 0.75 and 0.9
    logps = torch.log(torch.tensor([[1.25, 1.35], [0.75, 0.9]]))
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 2)
    loss, st = policy_loss(logps, logps, old, adv, mask, beta=0, clip_eps_low=0.2, clip_eps_high=0.28)
    # 1.25 is inside 1 + 0.28, 1.35 is clipped to 1.28; 0.75 is clipped to 0.8, 0.9 is inside
    assert loss.item() == pytest.approx(-((1.25 + 1.28) / 2 + (-0.8 - 0.9) / 2) / 2, rel=1e-5)
    assert st["clip_frac_high"].item() == 0.25 and st["clip_frac_low"].item() == 0.25
    assert st["clip_frac"].item() == 0.5
    assert st["ratio_max"].item() == pytest.approx(1.35)
    # symmetric 0.2 clips both positive-advantage tokens
    _, st2 = policy_loss(logps, logps, old, adv, mask, beta=0, clip_eps_low=0.2, clip_eps_high=0.2)
    assert st2["clip_frac_high"].item() == 0.5


@pytest.mark.parametrize("aggregate", [RowMean(), TokenMean(), ConstantNorm(4)])
@pytest.mark.parametrize("kl", ["k1", "k2", "k3"])
def test_no_nan_with_extreme_ratios_masked_rows_and_flat_groups(aggregate, kl):
    logps = torch.tensor([[50.0, -50.0, 0.0], [0.0, 0.0, 0.0], [-50.0, 50.0, 3.0]], requires_grad=True)
    ref = torch.tensor([[-50.0, 50.0, 0.0], [0.0, 0.0, 0.0], [50.0, -50.0, 0.0]])
    old = torch.tensor([[-50.0, 50.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, -50.0]])
    adv = torch.zeros(3)  # a group of identical rewards has advantage 0 everywhere
    for a in (adv, torch.tensor([1.0, -1.0, 0.5])):
        mask = torch.tensor([[1.0, 1, 1], [0, 0, 0], [1, 1, 1]])  # row 1 is all-masked
        loss, stats = policy_loss(logps, ref, old, a, mask, kl=KL_ESTIMATORS[kl], aggregate=aggregate)
        assert torch.isfinite(loss) and all(torch.isfinite(v) for v in stats.values())
        (grad,) = torch.autograd.grad(loss, logps)
        assert torch.isfinite(grad).all() and torch.equal(grad[1], torch.zeros(3))
    kl_at_bound = KL_ESTIMATORS[kl](torch.tensor([0.0]), torch.tensor([1e4]), LOG_RATIO_BOUND)
    assert torch.isfinite(kl_at_bound).all()
    # nothing masked in at all: every variant gives exactly 0
    empty, _ = policy_loss(logps, ref, old, adv, torch.zeros(3, 3), aggregate=aggregate)
    assert empty.item() == 0.0


@pytest.mark.parametrize("aggregate", [RowMean(), TokenMean(), ConstantNorm(8)])
def test_parts_of_a_split_sum_to_the_whole(aggregate):
    logps, ref, old, adv, mask = _case()
    per_token = torch.randn(logps.shape)
    whole = aggregate(per_token, mask)
    split = [torch.tensor([0, 3]), torch.tensor([1, 2, 4])]
    parts = sum(aggregate.part(per_token[rows], mask[rows], per_token.shape[0], mask.sum()) for rows in split)
    assert parts.item() == pytest.approx(whole.item(), rel=1e-5, abs=1e-7)
