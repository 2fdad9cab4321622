"""The lean decode step against the HF forward: same logits, same greedy tokens."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from grpo_aug.engines.sampling import generate
from grpo_aug.fast_llama.decode import _Product, prepacks, supports
from grpo_aug.models.tiny import build_char_tokenizer

PROMPTS = ["Q: What is 4 + 5?\nA: ", "Q: 7?\nA: ", "Q: What is (12 + 3) * 2?\nA: "]


def _model(kind, tok):
    common = dict(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=6, max_position_embeddings=128, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    if kind == "llama_gqa":
        return LlamaForCausalLM(LlamaConfig(num_key_value_heads=2, **common)).eval()
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(num_key_value_heads=6, tie_word_embeddings=True, **common)).eval()
    return Qwen2ForCausalLM(Qwen2Config(num_key_value_heads=3, **common)).eval()  # q/k/v carry biases


@pytest.mark.parametrize("kind", ["llama", "llama_gqa", "qwen2"])
def test_lean_decode_matches_the_hf_forward(kind):
    tok = build_char_tokenizer()
    model = _model(kind, tok)
    assert supports(model)
    greedy = torch.zeros(len(PROMPTS) * 2)
    rows = [p for p in PROMPTS for _ in range(2)]
    lean = generate(model, tok, rows, greedy, 1.0, 12)
    plain = generate(model, tok, rows, greedy, 1.0, 12, lean=False)
    assert torch.equal(lean.input_ids, plain.input_ids) and lean.texts == plain.texts
    # and the sampled path draws the same tokens from the same generator
    temps = torch.tensor([0.7, 1.5] * len(PROMPTS))
    a = generate(model, tok, rows, temps, 0.9, 12, generator=torch.Generator().manual_seed(3))
    b = generate(model, tok, rows, temps, 0.9, 12, generator=torch.Generator().manual_seed(3), lean=False)
    assert torch.equal(a.input_ids, b.input_ids)


@pytest.mark.parametrize("kind", ["llama_gqa", "qwen2"])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_step_logits_close_to_hf(kind, fused, dtype, monkeypatch):
    from transformers import DynamicCache

    import grpo_aug.fast_llama.decode as lean_decode
    from grpo_aug.fast_llama.compat import cache_kwargs
    from grpo_aug.fast_llama.decode import LeanDecoder

    if not fused:  # the wide-model path (the module's own weights), on a narrow model
        monkeypatch.setattr(lean_decode, "FUSE_BELOW_HIDDEN", 16)
    tok = build_char_tokenizer()
    model = _model(kind, tok)
    for name, p in model.named_parameters():  # weights only, as the rollout's bf16 copy (RoPE stays float32)
        if "norm" in name:  # norm weights start at 1: make a norm that drops its weight show
            p.data.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(len(name)))
        p.data = p.data.to(dtype)
    # bf16: the two paths round differently (cache layout, fused weights); the logits are O(1)
    atol = 1e-5 if dtype == torch.float32 else 3e-2
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    pos = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, position_ids=pos, use_cache=True,
              **cache_kwargs(model, cache))
        decoder = LeanDecoder(model, cache, enc.attention_mask, pos[:, -1:] + 1 + torch.arange(4), 4)
        assert all(p.fused == fused for p in decoder.projections)
        if fused:  # bf16 on a oneDNN-bf16 CPU: the packed products are what this test checks
            assert all(p.qkv_p.packed == prepacks(p.attn.q_proj.weight) for p in decoder.projections)
        ids, mask = enc.input_ids, enc.attention_mask
        for t in range(4):
            token = torch.full((len(PROMPTS),), 10 + t)
            lean_logits = decoder.step(token)
            ids = torch.cat([ids, token[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(token[:, None])], 1)
            full = model(input_ids=ids, attention_mask=mask,
                         position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits.float()
            assert torch.allclose(lean_logits, full[:, -1], atol=atol), (t, (lean_logits - full[:, -1]).abs().max())


def test_unsupported_models_fall_back():
    tok = build_char_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert not supports(LlamaForCausalLM(cfg))
    assert not supports(torch.nn.Linear(2, 2))


def test_rows_that_end_leave_the_batch_without_changing_any_row(monkeypatch):
    from grpo_aug.fast_llama.decode import LeanDecoder

    tok = build_char_tokenizer()
    model = _model("llama_gqa", tok)
    with torch.no_grad():  # make EOS likely, so rows end at different steps
        model.lm_head.weight[tok.eos_token_id] = model.lm_head.weight[tok.eos_token_id] * 4 + 0.05
    selects = []
    original = LeanDecoder.select
    monkeypatch.setattr(LeanDecoder, "select", lambda self, keep: (selects.append(len(keep)), original(self, keep)))
    rows = [p for p in PROMPTS for _ in range(3)]
    batch = generate(model, tok, rows, torch.zeros(len(rows)), 1.0, 30)
    assert selects, "no row ended early: the test did not exercise the compaction"
    lengths = batch.completion_mask.sum(1)
    assert lengths.min() < lengths.max()
    for i, row in enumerate(rows):  # each row alone: no batch, no compaction
        alone = generate(model, tok, [row], torch.zeros(1), 1.0, 30)
        n = int(alone.completion_mask.sum())
        assert n == int(lengths[i])
        start = batch.prompt_len
        own = alone.input_ids[0, alone.prompt_len : alone.prompt_len + n]
        assert torch.equal(batch.input_ids[i, start : start + n], own)


def test_sharded_models_sample_through_their_own_forward(monkeypatch):
    import grpo_aug.engines.sampling as sampler

    tok = build_char_tokenizer()
    model = _model("llama", tok)
    next(model.parameters()).ds_id = 0  # how DeepSpeed ZeRO-3 marks a partitioned parameter
    monkeypatch.setattr(sampler, "LeanDecoder", None)  # would fail if constructed
    greedy = torch.zeros(len(PROMPTS))
    out = generate(model, tok, PROMPTS, greedy, 1.0, 8)
    assert torch.equal(out.input_ids, generate(model, tok, PROMPTS, greedy, 1.0, 8, lean=False).input_ids)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kept_positions_are_the_last_ones(dtype):
    from grpo_aug.fast_llama.compat import keep_last

    tok = build_char_tokenizer()
    model = _model("llama", tok).to(dtype)
    ids = tok(PROMPTS[0], return_tensors="pt").input_ids  # [1, L]
    length = ids.shape[1]
    full = model(input_ids=ids).logits  # [1, L, V]
    kept = model(input_ids=ids, logits_to_keep=keep_last(model, 3, length)).logits  # [1, 3, V]
    assert kept.shape == (1, 3, full.shape[-1])
    assert torch.allclose(kept.float(), full[:, -3:].float(), atol=1e-5 if dtype == torch.float32 else 3e-2)
    assert isinstance(keep_last(model, 3, length), int) is (dtype == torch.float32)  # float32 keeps HF's own slice


@pytest.mark.skipif(not prepacks(torch.ones(1, dtype=torch.bfloat16)), reason="this CPU's oneDNN has no bf16")
@pytest.mark.parametrize("rows", [1, 5, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_products_against_float64(rows, with_bias):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 48, generator=g).bfloat16()  # [out, in]
    b = torch.randn(96, generator=g).bfloat16() if with_bias else None
    h, residual = torch.randn(rows, 48, generator=g).bfloat16(), torch.randn(rows, 96, generator=g).bfloat16()
    product = _Product(w, b)
    assert product.packed
    exact = h.double() @ w.double().t() + (0 if b is None else b.double())  # [rows, 96]
    # bf16 output: one rounding of values of size ~7, plus the float32 accumulation's
    tol = 2 ** -8 * exact.abs() + 1e-3
    assert ((product(h).double() - exact).abs() <= tol).all()
    with_res = exact + residual.double()
    assert ((product(h, residual).double() - with_res).abs() <= 2 ** -8 * with_res.abs() + 1e-3).all()


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")
@pytest.mark.parametrize("rows", [1, 8, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_float32_products_against_float64(rows, with_bias):
    from grpo_aug.fast_llama.decode import PACK_FLOAT32_FROM

    g = torch.Generator().manual_seed(rows)
    width = PACK_FLOAT32_FROM
    w = torch.randn(width, width, generator=g)  # [out, in]
    b = torch.randn(width, generator=g) if with_bias else None
    h, residual = torch.randn(rows, width, generator=g), torch.randn(rows, width, generator=g)
    product = _Product(w, b)
    assert product.packed
    exact = h.double() @ w.double().t() + (0 if b is None else b.double())  # [rows, width], values of size ~22
    # float32: 24 bits of mantissa, a sum of 512 products
    assert ((product(h).double() - exact).abs() <= 1e-5 * exact.abs() + 1e-3).all()
    with_res = exact + residual.double()
    assert ((product(h, residual).double() - with_res).abs() <= 1e-5 * with_res.abs() + 1e-3).all()


def test_narrow_float32_layers_keep_mkl_products():
    """The default run's 128-wide model samples as it was measured: no packed float32 copies."""
    from grpo_aug.fast_llama.decode import PACK_FLOAT32_FROM

    assert not prepacks(torch.ones(PACK_FLOAT32_FROM, PACK_FLOAT32_FROM - 1))
    assert not _Product(torch.ones(128, 512), None).packed  # the tiny model's down projection [hidden, intermediate]
    assert not _Product(torch.ones(512, 128), None).packed  # and its gate/up
    assert not prepacks(torch.ones(96, PACK_FLOAT32_FROM, dtype=torch.float16))


STEM_PROMPTS = ["Answer with a number only.\nQ: What is 4 + 5?\nA: ", "Answer with a number only.\nQ: 7?\nA: ",
                "Answer with a number only.\nQ: What is (12 + 3) * 2?\nA: "]


@pytest.mark.parametrize("kind", ["llama_gqa", "qwen2"])
@pytest.mark.parametrize("lean", [True, False])
def test_a_shared_stem_prefilled_once_samples_what_whole_prompts_do(kind, lean, monkeypatch):
    import grpo_aug.fast_llama.forward as lean_forward
    from grpo_aug.engines.sampling import prefill

    tok = build_char_tokenizer()
    model = _model(kind, tok)
    rows = [p for p in STEM_PROMPTS for _ in range(2)]
    temps = torch.tensor([0.0, 1.3] * len(STEM_PROMPTS))

    def run():
        return generate(model, tok, rows, temps, 0.9, 12, generator=torch.Generator().manual_seed(5), lean=lean)

    monkeypatch.setattr(lean_forward, "STEM_FROM", 10**9)
    whole = run()
    ids, mask, logits_whole, _, cache_mask, pos_whole = prefill(model, tok, rows, torch.device("cpu"))
    assert torch.equal(cache_mask, mask)
    monkeypatch.setattr(lean_forward, "STEM_FROM", 4)
    ids_s, mask_s, logits_stem, _, cache_mask, pos_stem = prefill(model, tok, rows, torch.device("cpu"))
    s = len("Answer with a number only.\nQ: ")  # one character a token
    # the rows' prompts as before; the cache holds the stem's columns, then each prompt's rest, left-padded
    assert torch.equal(ids_s, ids) and torch.equal(mask_s, mask) and torch.equal(pos_stem, pos_whole)
    assert cache_mask[:, :s].all() and torch.equal(cache_mask[:, s:], mask[:, : mask.shape[1] - s])
    assert torch.allclose(logits_stem, logits_whole, atol=1e-5), (logits_stem - logits_whole).abs().max()
    stem = run()
    assert torch.equal(stem.input_ids, whole.input_ids) and stem.texts == whole.texts
    assert torch.allclose(stem.sample_logprobs, whole.sample_logprobs, atol=1e-5)
