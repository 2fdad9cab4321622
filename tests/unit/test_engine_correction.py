"""algo/engine_correction: weights against a per-token Python loop, by value and by gradient
through the loss, and the configs that choose them."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_aug.algo import policy_loss
from grpo_aug.algo.engine_correction import (
    NoCorrection,
    SequenceMask,
    SequenceTruncate,
    TokenMask,
    TokenTruncate,
)
from grpo_aug.algo.settings import AlgoSettings
from helpers import compose_cfg

CAP = 3.0


def _inputs():
    g = torch.Generator().manual_seed(0)
    trainer = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3  # [R, T]
    engine = trainer + torch.randn(4, 6, generator=g, dtype=torch.float64) * 0.8  # some ratios above 3
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]],
                        dtype=torch.float64)
    return trainer, engine, mask


def _expected(trainer, engine, mask, per_row: bool, truncate: bool) -> list[list[float]]:
    """The weight of every token, one Python float at a time."""
    out = []
    for i in range(trainer.shape[0]):
        on = [j for j in range(trainer.shape[1]) if mask[i, j] > 0]
        row_ratio = math.exp(sum(float(trainer[i, j] - engine[i, j]) for j in on))
        weights = []
        for j in range(trainer.shape[1]):
            r = row_ratio if per_row else math.exp(float(trainer[i, j] - engine[i, j]) if j in on else 0.0)
            weights.append(min(r, CAP) if truncate else (0.0 if r > CAP else r))
        out.append(weights)
    return out


@pytest.mark.parametrize("variant,per_row,truncate", [(TokenTruncate, False, True), (TokenMask, False, False),
                                                      (SequenceTruncate, True, True), (SequenceMask, True, False)])
def test_weights_equal_a_per_token_loop(variant, per_row, truncate):
    trainer, engine, mask = _inputs()
    got = variant(cap=CAP)(trainer, engine, mask)
    want = torch.tensor(_expected(trainer, engine, mask, per_row, truncate), dtype=torch.float64)
    on = mask > 0
    assert torch.allclose(got.weight[on], want[on], rtol=1e-12)
    capped = (got.ratio > CAP) & on
    assert capped.any() and (~capped & on).any()  # the inputs exercise both sides of the cap
    assert got.masked.tolist() == (capped.tolist() if not truncate else torch.zeros_like(capped).tolist())


def test_no_correction_is_weight_one():
    trainer, engine, mask = _inputs()
    got = NoCorrection()(trainer, engine, mask)
    assert torch.equal(got.weight, torch.ones_like(trainer)) and not got.masked.any()


def test_the_loss_gradient_equals_a_per_token_loop_with_weights_on_the_policy_gradient_term_only():
    trainer, engine, mask = _inputs()
    g = torch.Generator().manual_seed(1)
    ref = trainer + torch.randn(4, 6, generator=g, dtype=torch.float64) * 0.1
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=torch.float64)
    old = trainer.clone()
    weight = TokenTruncate(cap=CAP)(old, engine, mask).weight
    beta, eps = 0.04, 0.2

    logps = (trainer + 0.1 * torch.randn(4, 6, generator=g, dtype=torch.float64)).requires_grad_(True)
    loss, _ = policy_loss(logps, ref, old, adv, mask, beta=beta, is_weight=weight)
    loss.backward()

    loop_logps = logps.detach().clone().requires_grad_(True)
    rows = []
    for i in range(4):
        terms, n = [], 0
        for j in range(6):
            if mask[i, j] == 0:
                continue
            r = torch.exp(loop_logps[i, j] - old[i, j])
            pg = torch.minimum(r * adv[i], r.clamp(1 - eps, 1 + eps) * adv[i])
            d = ref[i, j] - loop_logps[i, j]
            kl = torch.exp(d) - d - 1
            terms.append(weight[i, j] * pg - beta * kl)
            n += 1
        rows.append(sum(terms) / n)
    loop_loss = -sum(rows) / 4
    loop_loss.backward()
    assert loss.item() == pytest.approx(loop_loss.item(), rel=1e-12)
    assert torch.allclose(logps.grad, loop_logps.grad, rtol=1e-10, atol=1e-14)
    # and the weight changes the gradient: it is not a no-op
    plain = logps.detach().clone().requires_grad_(True)
    policy_loss(plain, ref, old, adv, mask, beta=beta)[0].backward()
    assert not torch.allclose(plain.grad, logps.grad)


def test_a_cap_below_one_and_a_non_variant_are_refused():
    with pytest.raises(ValueError, match="algo.engine_correction.cap must be >= 1"):
        TokenMask(cap=0.5)
    with pytest.raises(ValueError, match="algo.engine_correction must be a variant"):
        AlgoSettings(engine_correction="token_truncate")


@pytest.mark.parametrize("name,cls", [("none", NoCorrection), ("token_truncate", TokenTruncate),
                                      ("token_mask", TokenMask), ("sequence_truncate", SequenceTruncate),
                                      ("sequence_mask", SequenceMask)])
def test_each_option_composes(tmp_path, name, cls):
    from hydra.utils import instantiate

    algo = instantiate(compose_cfg(tmp_path, [f"algo/engine_correction={name}"]).algo, _convert_="all")
    assert type(algo.engine_correction) is cls
    assert type(instantiate(compose_cfg(tmp_path, []).algo).engine_correction) is TokenTruncate  # the default
