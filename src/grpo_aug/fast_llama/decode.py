"""A lean decode step for Llama-family models (Llama, Mistral, Qwen2): the same math as the HF
forward, without its per-token bookkeeping.

Decoding one token through the HF model rebuilds a 4-D attention mask, grows every layer's
KV cache with torch.cat and walks generic kwargs plumbing on each call: for small models that
overhead is most of the time. Here the prompt is prefilled by the HF model itself (one call), its
keys/values are copied once into buffers sized for the whole completion, and each new token runs
through the model's own weights, attending over a slice of those buffers (for narrow models,
weights re-laid-out once per rollout: `_Projections`). Models this does not cover fall back to
the HF forward; `tests/unit/test_fast_llama_decode.py` checks tokens and logits against it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUPPORTED = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


LEAN_FLAG = "grpo_aug_lean"  # set False on a model (algo.fast_llama=false) to keep it on the HF forward


def supports(model: torch.nn.Module) -> bool:
    if not getattr(model, LEAN_FLAG, True):
        return False
    config = getattr(model, "config", None)
    if type(model).__name__ not in SUPPORTED or config is None:
        return False
    # plain RoPE and full attention only: scaled/dynamic RoPE variants and sliding windows differ
    rope = getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    sliding = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    return rope_type == "default" and not sliding and not getattr(config, "attention_dropout", 0.0)


def sharded(model: torch.nn.Module) -> bool:
    """True when a strategy shards the weights (FSDP, DeepSpeed ZeRO-3): they cannot be read
    directly outside the model's own forward, so the lean paths step aside."""
    wrapped = any("FullyShard" in type(m).__name__ or "FSDP" in type(m).__name__ for m in model.modules())
    return wrapped or any(hasattr(p, "ds_id") for p in model.parameters())


def rms_norm(x: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
    """The model's RMSNorm `module` applied to x."""
    # HF's RMSNorm normalises in float32, casts back, then scales by the weight: for float32
    # activations torch's fused rms_norm is that; for bf16 the same three steps, in three calls
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), module.weight, module.variance_epsilon)
    if x.dtype == module.weight.dtype:
        return module.weight * F.rms_norm(x.float(), (x.shape[-1],), None, module.variance_epsilon).to(x.dtype)
    return module(x)


FUSE_BELOW_HIDDEN = 1024  # models narrower than this get fused, re-laid-out weight copies


PACK_FLOAT32_FROM = 512  # float32 weights with both sides at least this long get oneDNN-packed copies


def prepacks(weight: torch.Tensor) -> bool:
    """Whether `weight` gets a oneDNN-packed copy for the decode's products.

    bf16 on a CPU whose oneDNN runs bf16 (AMX/AVX-512 BF16): packed, a product with a handful of
    rows runs 1.5-2x faster than the strided bf16 GEMM (SmolLM2's layers at 8-64 rows); values
    equal a bf16 matmul's up to the order of the float32 accumulation (the rollout of 64 rows x 64
    tokens: ~640 -> ~800 tokens/s, docs/benchmarks.md).
    float32 weights of at least PACK_FLOAT32_FROM x PACK_FLOAT32_FROM: on an AVX2 CPU (AMD EPYC, two threads) the
    packed float32 products of SmolLM2's shapes at 8-64 rows ran 1.05-4x faster than MKL's (the
    vocabulary's at 8 rows 62 against 16 GFLOP/s), and its float32 rollout 1.26x (188 -> 236 tokens/s).
    Smaller weights (the default run's 128-wide model, its [128 x 512] down projection included)
    keep MKL's products, and the numbers they were measured with.
    """
    mkldnn = torch.ops.mkldnn
    if weight.device.type != "cpu" or not (torch.backends.mkldnn.is_available()
                                           and hasattr(mkldnn, "_reorder_linear_weight")):
        return False
    if weight.dtype == torch.float32:
        return weight.dim() == 2 and min(weight.shape) >= PACK_FLOAT32_FROM
    return weight.dtype == torch.bfloat16 and mkldnn._is_mkldnn_bf16_supported()


class _Product:
    """`h @ W.T (+ b) (+ residual)` for a weight W [out, in] laid out once per rollout: oneDNN-packed
    where `prepacks` says so, else transposed to [in, out] contiguous (with a handful of rows
    the matmul streams the weight, and MKL streams that layout about twice as fast as [out, in])."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.bias = bias
        self.packed = prepacks(weight)
        self.w = torch.ops.mkldnn._reorder_linear_weight(weight) if self.packed else weight.t().contiguous()

    def __call__(self, h: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """[N, in] -> [N, out], plus `residual` [N, out] when given."""
        if self.packed:
            if residual is None:
                return torch.ops.mkldnn._linear_pointwise(h, self.w, self.bias, "none", [], "")
            return torch.ops.mkldnn._linear_pointwise.binary(h, residual, self.w, self.bias, "add")
        if residual is None:
            return h @ self.w if self.bias is None else torch.addmm(self.bias, h, self.w)
        y = torch.addmm(residual, h, self.w)
        return y if self.bias is None else y + self.bias


class _Projections:
    """One layer's matmuls for decoding, set up once per rollout.

    Narrow models: at decode time every row contributes a single token, and the number of matmul
    calls, not their size, sets the pace. q/k/v and gate/up are concatenated into one matmul each,
    each weight laid out for small-M products (`_Product`). These copies are the size of the
    layer's weights, which only narrow models can afford; wider models use their own weights,
    where the matmuls are large enough for the call count not to matter.
    The attention scale is folded into the query (RoPE is linear, so scaling q before it equals
    scaling the scores after it).
    """

    def __init__(self, layer: torch.nn.Module) -> None:
        a, mlp = layer.self_attn, layer.mlp
        self.attn, self.mlp = a, mlp
        self.fused = a.q_proj.in_features < FUSE_BELOW_HIDDEN
        if not self.fused:
            return
        q, k, v = a.q_proj, a.k_proj, a.v_proj
        self.qkv_p = _Product(torch.cat([q.weight * a.scaling, k.weight, v.weight]),  # [Q+2K, H]
                              None if q.bias is None else torch.cat([q.bias * a.scaling, k.bias, v.bias]))
        self.o_p = _Product(a.o_proj.weight, a.o_proj.bias)  # [H, Q]
        gate, up = mlp.gate_proj, mlp.up_proj
        self.gate_up_p = _Product(torch.cat([gate.weight, up.weight]),  # [2I, H]
                                  None if gate.bias is None else torch.cat([gate.bias, up.bias]))
        self.down_p = _Product(mlp.down_proj.weight, mlp.down_proj.bias)  # [H, I]

    def qkv(self, h: torch.Tensor) -> torch.Tensor:
        """[N, H] -> [N, Q + 2 KV] (q already scaled)."""
        if self.fused:
            return self.qkv_p(h)
        a = self.attn
        return torch.cat([a.q_proj(h) * a.scaling, a.k_proj(h), a.v_proj(h)], dim=-1)

    def out(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """x + o_proj(h)."""
        return self.o_p(h, x) if self.fused else x + self.attn.o_proj(h)

    def mlp_residual(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """x + down(act(gate(h)) * up(h))."""
        m = self.mlp
        if not self.fused:
            return x + m.down_proj(m.act_fn(m.gate_proj(h)) * m.up_proj(h))
        gate, up = self.gate_up_p(h).chunk(2, dim=-1)
        return self.down_p(m.act_fn(gate) * up, x)


class LeanDecoder:
    """Holds the KV buffers of one batch; `step(token)` returns the next logits [N, V]."""

    def __init__(self, model: torch.nn.Module, cache, prompt_mask: torch.Tensor, positions: torch.Tensor,
                 max_new_tokens: int) -> None:
        self.model = model
        self.layers = model.model.layers
        n, p = prompt_mask.shape
        self.p = p
        total = p + max_new_tokens
        self.keys, self.values = [], []
        for layer in cache.layers:  # [N, KV, P, D] each
            k = layer.keys.new_empty(n, layer.keys.shape[1], total, layer.keys.shape[3])  # [N, KV, P+T, D]
            v = torch.empty_like(k)
            k[:, :, :p] = layer.keys
            v[:, :, :p] = layer.values
            self.keys.append(k)
            self.values.append(v)
        # key j is visible to every new token when it is a real prompt token or generated
        valid = torch.cat([prompt_mask.bool(), prompt_mask.new_ones(n, max_new_tokens, dtype=torch.bool)], dim=1)
        dtype = self.keys[0].dtype
        bias = torch.zeros(valid.shape, dtype=dtype, device=valid.device).masked_fill(~valid, torch.finfo(dtype).min)
        self.bias = bias[:, None, None, :]  # [N, 1, 1, P+T] added to the attention scores
        # rotary cos/sin for every position a new token will take, computed once
        dummy = self.keys[0]
        self.cos, sin = model.model.rotary_emb(dummy, positions)  # [N, T, D]
        # rotate_half(x) * sin == x[..., swap] * signed_sin: one gather instead of two slices,
        # a negation and a concatenation per step
        half = sin.shape[-1] // 2
        self.sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)  # [N, T, D]
        self.swap = torch.cat([torch.arange(half, 2 * half), torch.arange(half)]).to(sin.device)  # [D]
        attn = self.layers[0].self_attn
        self.heads = model.config.num_attention_heads
        self.head_dim = attn.head_dim
        self.kv_heads = model.config.num_key_value_heads
        self.projections = [_Projections(layer) for layer in self.layers]
        # the vocabulary projection gets a packed copy on the layers' terms: narrow models only
        head = model.lm_head
        packs = isinstance(head, torch.nn.Linear) and head.in_features < FUSE_BELOW_HIDDEN and prepacks(head.weight)
        self.head = _Product(head.weight, head.bias) if packs else head  # [N, H] -> [N, V]
        # one query token: in float32 plain matmuls beat scaled_dot_product_attention's CPU dispatch
        # at small shapes (and keep the float32 runs' numbers); in bf16/fp16 the matmuls copy the
        # cache slices and round the scores, and the fused kernel, accumulating in float32, is
        # 1.5-3x faster (SmolLM2's 64 rows, bf16: 0.4-0.65 ms against 0.9-1.2 ms per layer)
        self.fused_attention = dtype != torch.float32
        self.t = 0

    def select(self, keep: torch.Tensor) -> None:
        """Keep only rows `keep` [A'] (indices into the current batch) from now on."""
        self.keys = [k[keep] for k in self.keys]
        self.values = [v[keep] for v in self.values]
        self.bias, self.cos, self.sin = self.bias[keep], self.cos[keep], self.sin[keep]

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """x [N, heads, D] at one position per row; cos/signed_sin [N, 1, D]."""
        return torch.addcmul(x * cos, x.index_select(-1, self.swap), signed_sin)

    @torch.no_grad()
    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Feed token [N] at the next position; logits [N, V] for the one after it."""
        n, at, d = token.shape[0], self.p + self.t, self.head_dim
        cos, sin = self.cos[:, self.t : self.t + 1], self.sin[:, self.t : self.t + 1]  # [N, 1, D]
        bias = self.bias[..., : at + 1]  # [N, 1, 1, at+1]
        x = self.model.model.embed_tokens(token)  # [N, H]
        for i, (layer, proj) in enumerate(zip(self.layers, self.projections, strict=True)):
            qkv = proj.qkv(rms_norm(x, layer.input_layernorm)).view(n, -1, d)  # [N, Hq+2KV, D]
            qk = self._rope(qkv[:, : self.heads + self.kv_heads], cos, sin)  # [N, Hq+KV, D] one call for both
            q = qk[:, : self.heads]  # [N, Hq, D]
            self.keys[i][:, :, at] = qk[:, self.heads :]
            self.values[i][:, :, at] = qkv[:, self.heads + self.kv_heads :]
            # query heads are grouped over their shared KV head (head h reads KV head h // groups),
            # the groups standing where a query's positions would
            q = q.view(n, self.kv_heads, -1, d)  # [N, KV, groups, D]
            keys, values = self.keys[i][:, :, : at + 1], self.values[i][:, :, : at + 1]  # [N, KV, at+1, D]
            if self.fused_attention:
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, scale=1.0)  # [N, KV, groups, D]
            else:
                scores = q @ keys.transpose(-1, -2) + bias  # [N, KV, groups, at+1]
                out = torch.softmax(scores, dim=-1) @ values  # [N, KV, groups, D]
            x = proj.out(x, out.reshape(n, -1))  # [N, H]
            x = proj.mlp_residual(x, rms_norm(x, layer.post_attention_layernorm))
        self.t += 1
        return self.head(rms_norm(x, self.model.model.norm)).float()  # [N, V]
