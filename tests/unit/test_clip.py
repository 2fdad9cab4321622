"""Gradient clipping by hand: sharded ranks scaled by the whole model's norm clip as one model would."""

import math

import torch

from grpo_aug.algo.optim import clip_gradients_, gradient_norm


def _model(grads):
    m = torch.nn.Module()
    for i, g in enumerate(grads):
        p = torch.nn.Parameter(torch.zeros_like(g))
        p.grad = g.clone()
        m.register_parameter(f"p{i}", p)
    return m


def test_sharded_clipping_equals_clipping_the_whole_model():
    g = [torch.tensor([3.0, 4.0]), torch.tensor([12.0]), torch.tensor([0.0, 0.0, 84.0])]  # norm 85
    whole = _model(g)
    clip_gradients_(whole, 1.0)
    shards = [_model(g[:2]), _model(g[2:])]  # two ranks, each with part of the weights
    total = math.sqrt(sum(float(gradient_norm(s)) ** 2 for s in shards))  # what the rank reduce gives
    assert total == 85.0
    for s in shards:
        clip_gradients_(s, 1.0, total)
    clipped = [p.grad for s in shards for p in s.parameters()]
    assert all(torch.allclose(a.grad, b) for a, b in zip(whole.parameters(), clipped, strict=True))
    assert math.isclose(float(gradient_norm(whole)), 1.0, rel_tol=1e-5)
    assert torch.allclose(clipped[0], torch.tensor([3.0, 4.0]) / 85, atol=1e-7)


def test_below_the_limit_nothing_changes():
    m = _model([torch.tensor([0.3, 0.4])])
    clip_gradients_(m, 1.0, 0.5)
    assert torch.equal(m.p0.grad, torch.tensor([0.3, 0.4]))
