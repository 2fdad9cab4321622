"""The fixed-shape decode step (what a CUDA graph replays) against the eager lean loop, on a CPU:
the same tokens and log-probs from the same random stream, through rows that finish early, per-row
temperatures and limits, top-p / top-k / min-p, stop strings and the repetition penalty. (The
capture itself needs CUDA: scripts/gpu_check.py.)"""

import pytest
import torch
from test_fast_llama_decode import PROMPTS
from test_fast_llama_decode import _model as _cpu_model

from grpo_aug.engines.sampling import generate
from grpo_aug.engines.sampling_options import SamplingOptions
from grpo_aug.fast_llama.compat import cache_kwargs
from grpo_aug.fast_llama.decode import LeanDecoder
from grpo_aug.fast_llama.static_decode import StaticDecoder
from grpo_aug.models.tiny import build_char_tokenizer
from helpers import DEVICE

ROWS = [p for p in PROMPTS for _ in range(4)]  # 12 rows, groups of 4


def _model(kind, tok):
    """On CUDA (GRPO_TEST_ACCELERATOR=gpu, scripts/gpu_check.py) generate(static=True) replays a
    captured graph: the comparison is then captured against eager."""
    return _cpu_model(kind, tok).to(DEVICE)


def _pair(model, tok, temps, top_p, n, options=None, limits=None, seed=5):
    return [generate(model, tok, ROWS, temps, top_p, n, generator=torch.Generator(DEVICE).manual_seed(seed),
                     options=options, limits=limits, static=static) for static in (False, True)]


@pytest.mark.parametrize("kind", ["llama", "llama_gqa", "qwen2"])
def test_static_decode_draws_the_tokens_the_eager_loop_draws(kind):
    tok = build_char_tokenizer()
    model = _model(kind, tok)
    temps = torch.tensor([0.0, 0.7, 1.0, 1.5] * 3)
    eager, static = _pair(model, tok, temps, 0.9, 24)
    assert torch.equal(eager.input_ids, static.input_ids) and eager.texts == static.texts
    assert torch.equal(eager.completion_mask, static.completion_mask)
    assert torch.allclose(eager.sample_logprobs, static.sample_logprobs, atol=1e-5)
    assert eager.completion_mask.sum(1).unique().numel() > 1  # rows ended at different steps


def test_static_decode_with_sampling_options_and_limits():
    tok = build_char_tokenizer()
    model = _model("llama_gqa", tok)
    temps = torch.tensor([1.2] * 12)
    limits = torch.tensor([3, 20, 7, 20] * 3)
    options = SamplingOptions(top_k=20, min_p=0.05, repetition_penalty=1.3, stop=("7",))
    eager, static = _pair(model, tok, temps, 0.95, 20, options=options, limits=limits, seed=11)
    assert torch.equal(eager.input_ids, static.input_ids) and eager.texts == static.texts
    assert torch.equal(eager.truncated, static.truncated)
    assert eager.completion_mask.sum(1).max() > 3  # not every row stopped at once


def test_the_static_step_logits_equal_the_eager_step_while_rows_drop_out():
    """Step by step: the eager decoder compacts its batch, the static one keeps every row; the
    active rows' logits agree at every step (within float rounding: the static step sums over
    masked zero columns too)."""
    from transformers import DynamicCache

    tok = build_char_tokenizer()
    model = _cpu_model("qwen2", tok)  # the eager step by step, on the CPU
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    pos = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
    decoders = []
    for cls in (LeanDecoder, StaticDecoder):
        cache = DynamicCache()
        with torch.no_grad():
            model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, position_ids=pos, use_cache=True,
                  **cache_kwargs(model, cache))
        decoders.append(cls(model, cache, enc.attention_mask, pos[:, -1:] + 1 + torch.arange(6), 6))
    eager, static = decoders
    active = torch.arange(3)
    # row 1 leaves at step 3, then row 0 at step 5: the second `keep` indexes the active rows [0, 2],
    # not the batch, so a select() that kept `keep` itself would decode row 1 again
    drops = {3: torch.tensor([0, 2]), 5: torch.tensor([1])}
    for t in range(6):
        if t in drops:
            keep = drops[t]
            active = active[keep]
            eager.select(keep)
            static.select(keep)
        token = 10 + t + active
        a, b = eager.step(token), static.step(token)
        assert a.shape == b.shape == (len(active), len(tok))
        assert torch.allclose(a, b, atol=1e-5), (t, (a - b).abs().max())
