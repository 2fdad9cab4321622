"""TRL's newer policy losses (algo/surrogate, algo/loss=row_sum), the entropy mask and the KL
estimators, checked by value against numbers worked out by hand or by a plain per-token loop
(math on Python floats, not the code's tensor formulas)."""

import math

import pytest
import torch

from grpo_aug.algo.aggregate import ConstantNorm, RowSum, TokenMean
from grpo_aug.algo.kl import k1_kl, k2_kl, k3_kl
from grpo_aug.algo.loss import policy_loss
from grpo_aug.algo.objectives import CISPO, SAPO, VESPO
from grpo_aug.algo.ratio import SequenceRatio
from grpo_aug.update.chunk_loss import entropy_mask

# two rows of three tokens; row 1's last token is padding
OLD = [[-1.0, -2.0, -0.5], [-1.5, -1.0, -3.0]]
NEW = [[-1.0 + math.log(3.0), -2.0 - math.log(2.0), -0.5], [-1.5 + math.log(1.1), -1.0 + math.log(0.5), -3.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
ADV = [1.5, -0.8]


def _run(surrogate, aggregate=None, ratio=None):
    logps = torch.tensor(NEW, dtype=torch.float64, requires_grad=True)
    kwargs = {} if ratio is None else {"ratio": ratio}
    f64 = torch.float64
    loss, stats = policy_loss(logps, None, torch.tensor(OLD, dtype=f64), torch.tensor(ADV, dtype=f64),
                              torch.tensor(MASK, dtype=f64), beta=0.0, aggregate=aggregate or TokenMean(),
                              surrogate=surrogate, **kwargs)
    loss.backward()
    return loss.item(), logps.grad.tolist(), stats


def _tokens():
    for i in range(2):
        for t in range(3):
            if MASK[i][t]:
                yield i, t, math.exp(NEW[i][t] - OLD[i][t]), ADV[i]


def test_cispo_caps_the_weight_and_keeps_every_tokens_gradient():
    loss, grad, stats = _run(CISPO(max_ratio=2.0))
    n = 5  # loss tokens
    # by hand: weights min(r, 2) = 2 (r = 3, capped), 0.5, 1 | 1.1, 0.5
    expected = -sum(min(r, 2.0) * a * NEW[i][t] for i, t, r, a in _tokens()) / n
    assert loss == pytest.approx(expected, rel=1e-12)
    assert grad[0][0] == pytest.approx(-2.0 * 1.5 / 5)  # r = 3 > 2: the PPO clip would give 0 here
    assert grad[0][1] == pytest.approx(-0.5 * 1.5 / 5) and grad[0][2] == pytest.approx(-1.0 * 1.5 / 5)
    assert grad[1][0] == pytest.approx(-1.1 * -0.8 / 5) and grad[1][1] == pytest.approx(-0.5 * -0.8 / 5)
    assert grad[1][2] == 0.0
    assert stats.clip_frac_high.item() == pytest.approx(1 / 5)  # the one capped token
    # the PPO clip on the same batch: the r = 3, A > 0 token gets no gradient
    _, clip_grad, _ = _run(None)
    assert clip_grad[0][0] == 0.0


def test_sapo_gate_is_the_plain_gradient_at_r_1_and_fades_at_both_ends():
    tau_pos, tau_neg = 1.0, 1.05
    loss, grad, _ = _run(SAPO(tau_pos, tau_neg))

    def sig(x):
        return 1.0 / (1.0 + math.exp(-x))

    expected, n = 0.0, 5
    for i, t, r, a in _tokens():
        tau = tau_pos if a > 0 else tau_neg
        expected -= sig(tau * (r - 1)) * 4 / tau * a / n
        # d/dlogp of -sig(tau (r - 1)) 4/tau a / n = -4 sig (1 - sig) r a / n
        s = sig(tau * (r - 1))
        assert grad[i][t] == pytest.approx(-4 * s * (1 - s) * r * a / n, rel=1e-9), (i, t)
    assert loss == pytest.approx(expected, rel=1e-12)
    assert grad[0][2] == pytest.approx(-1.5 / 5)  # r = 1: exactly the unclipped gradient
    # far from 1 the gate closes on either side: r = e^4 and r = e^-4
    for shift in (4.0, -4.0):
        logps = torch.tensor([[shift]], dtype=torch.float64, requires_grad=True)
        f64 = torch.float64
        loss, _ = policy_loss(logps, None, torch.zeros(1, 1, dtype=f64), torch.tensor([1.0], dtype=f64),
                              torch.ones(1, 1, dtype=f64), beta=0.0, aggregate=TokenMean(),
                              surrogate=SAPO(tau_pos, tau_neg))
        loss.backward()
        r = math.exp(shift)
        s = sig(r - 1)
        assert logps.grad.item() == pytest.approx(-4 * s * (1 - s) * r, rel=1e-9)
        assert abs(logps.grad.item()) < 0.6  # the plain gradient would be r: 54.6 and 0.018


def test_vespo_weights_each_row_by_phi_of_its_sequence_ratio():
    v = VESPO(k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0)
    loss, grad, _ = _run(v)
    # by hand: row 0's sequence ratio 3 x 0.5 x 1 = 1.5 (A > 0: k 2, lambda 3),
    # row 1's 1.1 x 0.5 = 0.55 (A < 0: k 3, lambda 2)
    phi0 = math.exp(3.0) * 1.5**2 * math.exp(-3.0 * 1.5)
    phi1 = math.exp(2.0) * 0.55**3 * math.exp(-2.0 * 0.55)
    n = 5
    expected = -(phi0 * 1.5 * sum(NEW[0]) + phi1 * -0.8 * (NEW[1][0] + NEW[1][1])) / n
    assert loss == pytest.approx(expected, rel=1e-12)
    assert grad[0] == pytest.approx([-phi0 * 1.5 / n] * 3, rel=1e-12)
    assert grad[1][:2] == pytest.approx([-phi1 * -0.8 / n] * 2, rel=1e-12) and grad[1][2] == 0.0
    # phi = 1 at w = 1, and near 0 at both ends (w = e^-10, w = e^3)
    adv = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    log_ratio = torch.tensor([[0.0], [-10.0], [3.0]], dtype=torch.float64)
    phi = v.weights(log_ratio, adv[:, None]).flatten().tolist()
    assert phi[0] == pytest.approx(1.0)
    assert phi[1] == pytest.approx(math.exp(3.0 - 20.0 - 3.0 * math.exp(-10.0)))
    assert phi[2] == pytest.approx(math.exp(3.0 + 6.0 - 3.0 * math.exp(3.0)))
    assert phi[1] < 1e-7 and phi[2] < 1e-20


def test_luspo_scales_each_rows_gspo_loss_by_its_length():
    eps = 0.2
    loss, grad, _ = _run(None, aggregate=RowSum(), ratio=SequenceRatio())
    expected = 0.0
    for i in range(2):
        on = [t for t in range(3) if MASK[i][t]]
        s = math.exp(sum(NEW[i][t] - OLD[i][t] for t in on) / len(on))  # GSPO: the geometric mean ratio
        a = ADV[i]
        expected -= len(on) * min(s * a, min(max(s, 1 - eps), 1 + eps) * a) / 2  # mean over the 2 rows
    assert loss == pytest.approx(expected, rel=1e-12)
    # row 0: s = (3 x 0.5 x 1)^(1/3) = 1.145 is inside the clip, so each token's gradient is
    # -(len / rows) x A x s / len = -A s / 2 (d s / d logp_t = s / len)
    s0 = 1.5 ** (1 / 3)
    assert grad[0] == pytest.approx([-1.5 * s0 / 2] * 3, rel=1e-9)
    # row 1: s = 0.742 < 0.8 with A < 0: clipped, no gradient
    assert grad[1] == [0.0, 0.0, 0.0]


def test_entropy_mask_keeps_the_top_share_by_a_sort_done_by_hand():
    entropy = torch.tensor([[0.9, 0.1, 2.0, 0.5], [1.2, 0.3, 7.0, 0.05]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    # the 6 loss tokens sorted: 0.1, 0.3, 0.5, 0.9, 1.2, 2.0. The 0.5 quantile (top 50%) sits at
    # position 0.5 x 5 = 2.5: halfway from 0.5 to 0.9 = 0.7, so 0.9, 1.2, 2.0 are kept
    kept = entropy_mask(entropy, mask, 0.5)
    assert kept.tolist() == [[True, False, True, False], [True, False, False, False]]
    # top 20%: position 0.8 x 5 = 4, exactly 1.2: 1.2 and 2.0 kept (7.0 is padding)
    assert entropy_mask(entropy, mask, 0.2).tolist() == [[False, False, True, False], [True, False, False, False]]
    assert entropy_mask(entropy, mask, 1.0).tolist() == mask.bool().tolist()
    assert not entropy_mask(entropy, torch.zeros_like(mask), 0.5).any()


def test_kl_estimators_and_constant_normalisation_by_value():
    logps = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    # d = ref - logp = -0.5, 1.0
    assert k1_kl(logps, ref, 20.0).flatten().tolist() == pytest.approx([0.5, -1.0])
    assert k2_kl(logps, ref, 20.0).flatten().tolist() == pytest.approx([0.125, 0.5])
    assert k3_kl(logps, ref, 20.0).flatten().tolist() == pytest.approx([math.exp(-0.5) - 0.5, math.exp(1.0) - 2.0])
    # the bound: d = 30 counts as 20
    assert k2_kl(torch.tensor([[0.0]]), torch.tensor([[30.0]]), 20.0).item() == pytest.approx(200.0)
    # constant normalisation: (sum of masked per-token terms) / (rows x constant)
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert ConstantNorm(10.0)(per_token, mask).item() == pytest.approx((1 + 2 + 4) / (2 * 10))
    assert RowSum()(per_token, mask).item() == pytest.approx((3 + 4) / 2)
    with pytest.raises(ValueError, match="algo.loss.constant"):
        ConstantNorm(0.0)
