"""bf16-mixed against float32 on the same step: the update's token log-probs and its gradient
agree within bf16's precision (8 bits of mantissa, ~2-3 significant digits). On the CPU here, and
on CUDA under scripts/gpu_check.py (GRPO_TEST_ACCELERATOR=gpu).

Measured on the tiny model (CPU, 2 cores): log-prob gap 0.0017 at most, gradient cosine
0.99999, norm ratio 0.9998. A log-softmax taken in bf16 under autocast (a broken build, tried
once) moves the log-probs by 0.022, so the gap is held to 0.01."""

from __future__ import annotations

import functools

import torch

from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.fast_llama.logprobs import token_logprobs
from grpo_aug.rollout.settings import RolloutSettings
from grpo_aug.update.chunk_loss import chunk_loss
from helpers import DEVICE, make_module, prepared

EASY = [r for r in SyntheticArithmetic(size_per_bucket=10, seed=0).load() if r.bucket == "easy"]
LOGPROB_TOL = 0.01  # per token, in nats
MIN_COSINE, NORM_RATIO = 0.99, (0.95, 1.05)


def _step(module, step, bf16: bool):
    """The step's token log-probs and the gradient of its loss over every row, under bf16
    autocast or in float32."""
    policy = module.policy
    policy.zero_grad()
    ro = step.rollout
    rows = torch.arange(len(ro.texts), device=ro.input_ids.device)
    aggregate = functools.partial(module.algo.loss.part, rows=len(rows), tokens=step.mask.sum())
    with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=bf16):
        logps = token_logprobs(policy, ro.input_ids, ro.attention_mask, ro.prompt_len, ro.temperatures)
        loss, _ = chunk_loss(policy, module.update.scorer, module.update.objective, module.algo.engine_correction,
                             step, rows, 0.04, aggregate)
    loss.backward()
    grad = torch.cat([p.grad.flatten().float() for p in policy.parameters() if p.grad is not None])
    return logps.detach().float(), grad


def test_a_bf16_mixed_step_matches_the_float32_step(tiny_model_dir):
    module = make_module(tiny_model_dir, rollout=RolloutSettings(group_size=4, max_new_tokens=12))
    module.configure_model()
    module.policy.to(DEVICE)
    module.models.place(torch.device(DEVICE), None)  # the reference beside it (CUDA under scripts/gpu_check.py)
    torch.manual_seed(0)
    step = prepared(module, EASY[:4])
    assert step.mask.sum() > 0 and step.advantages.abs().sum() > 0  # a step with something to learn
    full_lp, full_grad = _step(module, step, bf16=False)
    mixed_lp, mixed_grad = _step(module, step, bf16=True)
    on = step.mask > 0
    gap = (full_lp - mixed_lp)[on].abs().max()
    cosine = torch.nn.functional.cosine_similarity(full_grad, mixed_grad, dim=0)
    ratio = mixed_grad.norm() / full_grad.norm()
    assert gap > 0  # bf16 did run: an identical result would mean autocast never applied
    assert gap < LOGPROB_TOL, gap
    assert cosine > MIN_COSINE and NORM_RATIO[0] < ratio < NORM_RATIO[1], (float(cosine), float(ratio))
