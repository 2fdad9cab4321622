"""Scoring with the prompt run once per group (packed forward, or HF forward with a shared KV
prefix) equals scoring every full row: values and gradients."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import grpo_aug.fast_llama.logprobs as logprobs
from grpo_aug.fast_llama.logprobs import token_logprobs


def _case():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=30, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg)
    P, T = 5, 6
    prompts = torch.randint(3, 30, (3, P))
    prompt_mask = torch.ones(3, P, dtype=torch.long)
    prompt_mask[1, :2] = 0  # a left-padded prompt
    prompts[1, :2] = 0
    rows = torch.tensor([0, 2, 0, 1, 2, 1])  # groups need not be contiguous
    completion = torch.randint(3, 30, (6, T))
    completion_mask = torch.ones(6, T, dtype=torch.long)
    completion_mask[0, 3:] = 0  # a row that ended early
    completion[0, 3:] = 0
    ids = torch.cat([prompts[rows], completion], 1)
    mask = torch.cat([prompt_mask[rows], completion_mask], 1)
    temps = torch.tensor([0.7, 1.0, 1.2, 1.5, 0.0, 1.0])
    return model, ids, mask, P, temps, completion_mask.bool()


@pytest.mark.parametrize("path", ["packed", "hf_shared_prefix"])
def test_shared_prefix_matches_full_rows(path, monkeypatch):
    model, ids, mask, P, temps, on = _case()
    calls = []
    model.register_forward_hook(lambda m, a, kw, out: calls.append(kw["input_ids"].shape), with_kwargs=True)
    if path == "hf_shared_prefix":  # what a sharded model gets
        monkeypatch.setattr(logprobs, "packable", lambda m: False)
    shared, entropy = token_logprobs(model, ids, mask, P, temps, with_entropy=True)
    if path == "packed":
        assert calls == []  # the model's own forward never runs
    else:
        assert calls == [(3, P), (6, ids.shape[1] - P - 1)]  # 3 distinct prompts once, then completions only
    monkeypatch.setattr(logprobs, "packable", lambda m: False)
    monkeypatch.setattr(logprobs, "supports", lambda m: False)
    full, full_entropy = token_logprobs(model, ids, mask, P, temps, with_entropy=True)
    assert torch.allclose(shared[on], full[on], atol=1e-5)
    assert torch.allclose(entropy[on], full_entropy[on], atol=1e-5)
    # entropy by its definition, from the full-row logits at each row's temperature
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask,
                       position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits[:, P - 1 : -1]
        t = torch.where(temps > 0, temps, torch.ones_like(temps))[:, None, None]
        expected = torch.distributions.Categorical(logits=logits / t).entropy()  # [N, T]
    assert torch.allclose(entropy[on], expected[on], atol=1e-5)
    params = list(model.parameters())
    g_shared = torch.autograd.grad(shared[on].sum(), params)
    g_full = torch.autograd.grad(full[on].sum(), params)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g_shared, g_full, strict=True))


def test_distinct_prompts_take_the_plain_path(monkeypatch):
    monkeypatch.setattr(logprobs, "packable", lambda m: False)  # the HF path: nothing to share, one forward
    model, ids, mask, P, temps, on = _case()
    calls = []
    model.register_forward_hook(lambda m, a, kw, out: calls.append(kw["input_ids"].shape), with_kwargs=True)
    token_logprobs(model, ids[[0, 1, 3]], mask[[0, 1, 3]], P, temps[[0, 1, 3]])
    assert calls == [(3, ids.shape[1])]
