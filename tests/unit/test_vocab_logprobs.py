"""Block-by-block vocabulary log-probs against the direct formula (float64) and the HF forward."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import grpo_aug.fast_llama.logprobs as lean_logprobs
import grpo_aug.fast_llama.vocab_logprobs as vocab
from grpo_aug.fast_llama.logprobs import token_logprobs
from grpo_aug.fast_llama.vocab_logprobs import vocab_logprobs


def _direct(h, w, targets, temps):
    """log softmax(h W^T / T)[target] and the entropy, the textbook way."""
    z = (h @ w.t()) / temps[:, None]  # [M, V]
    logp = z.log_softmax(-1)
    return logp.gather(-1, targets[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.fixture
def small_blocks(monkeypatch):
    # blocks of 3 rows, gradient buffers of 2 blocks: 23 rows cross every boundary
    monkeypatch.setattr(vocab, "BLOCK_ELEMENTS", 3 * 50)
    monkeypatch.setattr(vocab, "GRAD_BYTES", 2 * 3 * 50 * 8)


@pytest.mark.parametrize("used", ["both", "logps", "entropy"])
def test_values_and_gradients_match_the_direct_formula(small_blocks, used):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(23, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 8, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (23,), generator=g)
    temps = torch.rand(23, generator=g, dtype=torch.float64) + 0.5
    a, b = torch.randn(23, generator=g, dtype=torch.float64), torch.randn(23, generator=g, dtype=torch.float64)

    def loss(logp, ent):
        return (a * logp).sum() * (used != "entropy") + (b * ent).sum() * (used != "logps")

    logp, ent = vocab_logprobs(h, w, targets, temps, with_entropy=True)
    want_logp, want_ent = _direct(h, w, targets, temps)
    assert torch.allclose(logp, want_logp.float(), atol=1e-5) and torch.allclose(ent, want_ent.float(), atol=1e-5)
    got = torch.autograd.grad(loss(logp.double(), ent.double()), (h, w))
    want = torch.autograd.grad(loss(want_logp, want_ent), (h, w))
    for x, y in zip(got, want, strict=True):  # float32 internals: log-probs rounded to float32
        assert torch.allclose(x, y, atol=1e-4, rtol=1e-4), (x - y).abs().max()


def test_autocast_computes_the_projection_in_its_dtype(small_blocks):
    g = torch.Generator().manual_seed(1)
    h = torch.randn(10, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)
    targets, temps = torch.randint(0, 50, (10,), generator=g), torch.full((10,), 0.7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, _ = vocab_logprobs(h, w, targets, temps)
        z = torch.nn.functional.linear(h, w).float() / 0.7  # what the module would compute
    want = z.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    assert torch.allclose(logp, want, atol=1e-5)  # the same bf16 products, not float32 ones
    assert not torch.allclose(logp, _direct(h, w, targets, temps)[0], atol=1e-3)
    logp.sum().backward()
    assert w.grad.dtype == torch.float32 and h.grad.dtype == torch.float32


def _model(vocab_size=300):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))


def _rows():
    """2 prompts (one left-padded) in 4 rows; completions of 5, 2, 1 and 4 tokens."""
    g = torch.Generator().manual_seed(2)
    P, T = 4, 5
    prompts = torch.randint(3, 300, (2, P), generator=g)
    prompt_mask = torch.ones(2, P, dtype=torch.long)
    prompt_mask[1, :1], prompts[1, :1] = 0, 0
    rows = torch.tensor([0, 1, 0, 1])
    completion = torch.randint(3, 300, (4, T), generator=g)
    completion_mask = (torch.arange(T)[None] < torch.tensor([5, 2, 1, 4])[:, None]).long()
    completion[completion_mask == 0] = 0
    return (torch.cat([prompts[rows], completion], 1), torch.cat([prompt_mask[rows], completion_mask], 1), P,
            completion_mask.bool())


def test_scoring_through_blocks_matches_the_direct_path(monkeypatch):
    model = _model()
    ids, mask, P, on = _rows()
    temps = torch.tensor([0.7, 1.0, 0.0, 1.5])  # 0: a greedy row, scored at T = 1
    monkeypatch.setattr(vocab, "BLOCK_ELEMENTS", 3 * 300)
    monkeypatch.setattr(lean_logprobs, "BLOCK_ELEMENTS", 3 * 300)
    assert lean_logprobs.blocked_vocabulary(model, ids, P)
    logp, ent = token_logprobs(model, ids, mask, P, temps, with_entropy=True, entropy_grad=True)
    (logp[on].sum() + 0.1 * ent[on].sum()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    monkeypatch.setattr(lean_logprobs, "BLOCK_ELEMENTS", 10**12)  # the [N, T, V] path
    assert not lean_logprobs.blocked_vocabulary(model, ids, P)
    want_logp, want_ent = token_logprobs(model, ids, mask, P, temps, with_entropy=True, entropy_grad=True)
    (want_logp[on].sum() + 0.1 * want_ent[on].sum()).backward()
    assert torch.allclose(logp[on], want_logp[on], atol=1e-5) and torch.allclose(ent[on], want_ent[on], atol=1e-5)
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all()  # padding: masked by the caller, finite
    for got, want in zip(grads, (p.grad for p in model.parameters()), strict=True):
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_the_default_tiny_vocabulary_keeps_the_direct_path():
    ids, mask, P, _ = _rows()
    assert not lean_logprobs.blocked_vocabulary(_model(vocab_size=19), ids.clamp(max=18), P)
    assert lean_logprobs.blocked_vocabulary(_model(vocab_size=49152), ids, P) is (4 * 5 * 49152 > vocab.BLOCK_ELEMENTS)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")
def test_packed_float32_projection_matches_the_direct_formula(small_blocks):
    """float32 hidden states as wide as the decode packs (SmolLM2's 576): the projection runs on a
    oneDNN-packed copy, forward and in backward's recomputation; values and gradients as the formula's."""
    from grpo_aug.fast_llama.decode import PACK_FLOAT32_FROM

    g = torch.Generator().manual_seed(2)
    h = torch.randn(23, PACK_FLOAT32_FROM, generator=g, requires_grad=True) / 8
    w = torch.randn(PACK_FLOAT32_FROM, PACK_FLOAT32_FROM, generator=g, requires_grad=True)  # [V, H]
    assert vocab._projection(w.detach()).packed  # the decode's packed product, not F.linear
    targets = torch.randint(0, PACK_FLOAT32_FROM, (23,), generator=g)
    temps = torch.rand(23, generator=g) + 0.5
    a, b = torch.randn(23, generator=g), torch.randn(23, generator=g)
    logp, ent = vocab_logprobs(h, w, targets, temps, with_entropy=True)
    hd, wd = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want_logp, want_ent = _direct(hd, wd, targets, temps.double())
    assert torch.allclose(logp.double(), want_logp, atol=1e-4) and torch.allclose(ent.double(), want_ent, atol=1e-4)
    got = torch.autograd.grad((a * logp).sum() + (b * ent).sum(), (h, w))
    want = torch.autograd.grad((a.double() * want_logp).sum() + (b.double() * want_ent).sum(), (hd, wd))
    for x, y in zip(got, want, strict=True):
        assert torch.allclose(x.double(), y, atol=1e-4, rtol=1e-3), (x.double() - y).abs().max()
