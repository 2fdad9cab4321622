"""Precision and memory switches: bf16 weights, bf16-mixed training on CPU, gradient
checkpointing, and the lean paths (decode loop, packed forward) against the HF forward in bf16
and under autocast."""

import functools

import pytest
import torch

from grpo_aug.algo.settings import AlgoSettings
from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.engines.sampling import generate
from grpo_aug.fast_llama.decode import LEAN_FLAG, supports
from grpo_aug.fast_llama.logprobs import token_logprobs
from grpo_aug.models.loading import load_policy, load_tokenizer
from grpo_aug.rollout.filter import GroupFilter
from grpo_aug.rollout.settings import RolloutSettings
from grpo_aug.update.chunk_loss import chunk_loss
from helpers import TINY, all_finite, make_module, prepared, read_scalars, train_here

EASY = [r for r in SyntheticArithmetic(size_per_bucket=10, seed=0).load() if r.bucket == "easy"]


def _rollout(path, dtype="float32"):
    model, tokenizer = load_policy(str(path), dtype), load_tokenizer(str(path))
    torch.manual_seed(0)
    texts = [p.prompt for p in EASY[:3] for _ in range(4)]
    ro = generate(model, tokenizer, texts, torch.full((12,), 1.2), 1.0, 10, lean=False)
    return model, ro


def _logprobs(model, ro, lean):
    setattr(model, LEAN_FLAG, lean)
    assert supports(model) is lean
    with torch.no_grad():
        return token_logprobs(model, ro.input_ids, ro.attention_mask, ro.prompt_len, ro.temperatures)


@pytest.mark.parametrize("setting", ["bfloat16 weights", "fp32 weights under bf16 autocast"])
def test_lean_forward_matches_the_hf_forward_in_bf16(tiny_model_dir, setting):
    dtype = "bfloat16" if setting.startswith("bfloat16") else "float32"
    model, ro = _rollout(tiny_model_dir, dtype)
    on = ro.completion_mask.bool()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "float32"):
        lean, hf = _logprobs(model, ro, True), _logprobs(model, ro, False)
    # bf16 keeps 8 bits of mantissa: both paths round differently, not by more than that
    assert torch.allclose(lean[on], hf[on], atol=0.1, rtol=0.02)
    assert (lean[on] - hf[on]).abs().mean() < 0.02
    with torch.no_grad():
        fp32 = _logprobs(load_policy(str(tiny_model_dir)), ro, False)
    assert (lean[on] - fp32[on]).abs().mean() < 0.05  # and both are close to fp32


def test_lean_decode_in_bf16_samples_what_the_hf_loop_samples(tiny_model_dir):
    model, tokenizer = load_policy(str(tiny_model_dir), "bfloat16"), load_tokenizer(str(tiny_model_dir))
    texts = [p.prompt for p in EASY[:4]]
    greedy = torch.zeros(4)
    lean = generate(model, tokenizer, texts, greedy, 1.0, 8, lean=True)
    hf = generate(model, tokenizer, texts, greedy, 1.0, 8, lean=False)
    same = sum(a == b for a, b in zip(lean.texts, hf.texts, strict=True))
    assert same >= 3  # greedy: equal unless a bf16 rounding flips a near-tie


def _module(path, algo=None, **kwargs):
    m = make_module(path, rollout=RolloutSettings(group_size=4, temperatures=(1.0,), top_p=1.0, max_new_tokens=8,
                                                  filter=GroupFilter(zero_std=False)), algo=algo, **kwargs)
    m.configure_model()
    return m


def _loss_and_grads(m, step):
    m.policy.zero_grad()
    rows = torch.arange(len(step.rollout.input_ids))
    aggregate = functools.partial(m.algo.loss.part, rows=len(rows), tokens=step.mask.sum())
    loss, _ = chunk_loss(m.policy, m.update.scorer, m.update.objective, m.algo.engine_correction, step, rows, 0.04,
                         aggregate)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in m.policy.parameters()]


@pytest.mark.parametrize("switch", ["gradient_checkpointing", "lean_off"])
def test_checkpointing_and_the_hf_path_give_the_same_loss_and_gradient(tiny_model_dir, switch):
    plain = _module(tiny_model_dir)
    other = _module(tiny_model_dir, gradient_checkpointing=True) if switch == "gradient_checkpointing" else \
        _module(tiny_model_dir, algo=AlgoSettings(fast_llama=False))
    if switch == "gradient_checkpointing":
        assert other.policy.is_gradient_checkpointing
    else:
        assert not supports(other.policy)
    torch.manual_seed(0)
    step = prepared(plain, EASY[:3])
    loss_a, grads_a = _loss_and_grads(plain, step)
    loss_b, grads_b = _loss_and_grads(other, step)
    assert loss_b == pytest.approx(loss_a, rel=1e-5, abs=1e-6)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads_a, grads_b, strict=True))


def test_sampling_is_unchanged_by_gradient_checkpointing(tiny_model_dir):
    outs = []
    for checkpointing in (False, True):
        m = _module(tiny_model_dir, gradient_checkpointing=checkpointing)
        torch.manual_seed(0)
        outs.append(prepared(m, EASY[:2]).rollout.texts)
    assert outs[0] == outs[1]


@pytest.mark.parametrize("overrides", [["trainer.precision=bf16-mixed"], ["model.dtype=bfloat16"],
                                       ["model.gradient_checkpointing=true"], ["algo.fast_llama=false"]])
def test_short_runs_with_each_switch_train_and_stay_finite(tmp_path, overrides):
    train_here(tmp_path, ["debug=fast", *TINY, "rollout.filter.zero_std=false", *overrides])
    scalars = read_scalars(tmp_path / "run")
    assert all_finite(scalars["train/loss"]) and all_finite(scalars["health/kl_mean"])
