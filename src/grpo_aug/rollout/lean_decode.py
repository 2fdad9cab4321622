"""A lean decode step for Llama-family models (Llama, Mistral, Qwen2): the same math as the HF
forward, without its per-token bookkeeping.

Decoding one token through the HF model rebuilds a 4-D attention mask, grows every layer's
KV cache with torch.cat and walks generic kwargs plumbing on each call: for small models that
overhead is most of the time. Here the prompt is prefilled by the HF model itself (one call), its
keys/values are copied once into buffers sized for the whole completion, and each new token runs
through the model's own weights, attending over a slice of those buffers.
The q/k/v projections and the MLP's gate/up projections are fused into one matmul each (their
weights are concatenated once per rollout, a copy the size of those weights): at decode time
every row contributes a single token, and for small models the number of matmul calls, not
their size, sets the pace. Models this does not cover fall back to the HF forward;
`tests/unit/test_lean_decode.py` checks tokens and logits against it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUPPORTED = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


def supports(model: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    if type(model).__name__ not in SUPPORTED or config is None:
        return False
    # plain RoPE and full attention only: scaled/dynamic RoPE variants and sliding windows differ
    rope = getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    sliding = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    return rope_type == "default" and not sliding and not getattr(config, "attention_dropout", 0.0)


def residual(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x + h @ weight.T (+ bias), the add fused into the matmul when there is no bias."""
    if bias is None:
        return torch.addmm(x, h, weight.t())
    return x + F.linear(h, weight, bias)


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
        self.cos, self.sin = model.model.rotary_emb(dummy, positions)  # [N, T, D]
        attn = self.layers[0].self_attn
        self.heads = model.config.num_attention_heads
        self.head_dim = attn.head_dim
        self.kv_heads = model.config.num_key_value_heads
        self.weights = []  # per layer: everything step() needs, looked up once
        for layer in self.layers:
            a, mlp = layer.self_attn, layer.mlp
            # the attention scale is folded into the query rows (rotary embedding is linear, so
            # scaling q before it equals scaling the scores after it)
            qkv_weight = torch.cat([a.q_proj.weight * a.scaling, a.k_proj.weight, a.v_proj.weight])  # [(Hq+2KV)*D, H]
            biases = [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]
            qkv_bias = torch.cat([biases[0] * a.scaling, *biases[1:]]) if all(b is not None for b in biases) else None
            gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])  # [2I, H]
            self.weights.append((layer.input_layernorm, qkv_weight, qkv_bias, a.o_proj.weight, a.o_proj.bias,
                                 layer.post_attention_layernorm, gate_up, mlp.down_proj.weight, mlp.down_proj.bias,
                                 mlp.act_fn))
        self.q_size = self.heads * self.head_dim
        self.kv_size = model.config.num_key_value_heads * self.head_dim
        self.t = 0

    def select(self, keep: torch.Tensor) -> None:
        """Keep only rows `keep` [A'] (indices into the current batch) from now on."""
        self.keys = [k[keep] for k in self.keys]
        self.values = [v[keep] for v in self.values]
        self.bias, self.cos, self.sin = self.bias[keep], self.cos[keep], self.sin[keep]

    @staticmethod
    def _norm(x: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
        # HF's RMSNorm computes in float32; for float32 activations torch's fused rms_norm is that
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), module.weight, module.variance_epsilon)
        return module(x)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [N, heads, D] at one position per row; cos/sin [N, 1, D]."""
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    @torch.no_grad()
    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Feed token [N] at the next position; logits [N, V] for the one after it."""
        n, at, d = token.shape[0], self.p + self.t, self.head_dim
        cos, sin = self.cos[:, self.t : self.t + 1], self.sin[:, self.t : self.t + 1]  # [N, 1, D]
        bias = self.bias[..., : at + 1]  # [N, 1, 1, at+1]
        x = self.model.model.embed_tokens(token)  # [N, H]
        for i, (ln1, qkv_w, qkv_b, o_w, o_b, ln2, gate_up, down_w, down_b, act) in enumerate(self.weights):
            q, k, v = F.linear(self._norm(x, ln1), qkv_w, qkv_b).split([self.q_size, self.kv_size, self.kv_size], -1)
            q = self._rope(q.view(n, -1, d), cos, sin)  # [N, Hq, D]
            k = self._rope(k.view(n, -1, d), cos, sin)  # [N, KV, D]
            self.keys[i][:, :, at] = k
            self.values[i][:, :, at] = v.view(n, -1, d)
            # one query token: plain matmuls beat scaled_dot_product_attention's CPU dispatch here;
            # query heads are grouped over their shared KV head (head h reads KV head h // groups)
            q = q.view(n, self.kv_heads, -1, d)  # [N, KV, groups, D]
            scores = q @ self.keys[i][:, :, : at + 1].transpose(-1, -2) + bias  # [N, KV, groups, at+1]
            out = torch.softmax(scores, dim=-1) @ self.values[i][:, :, : at + 1]  # [N, KV, groups, D]
            x = residual(x, out.reshape(n, -1), o_w, o_b)  # [N, H]
            gate, up = F.linear(self._norm(x, ln2), gate_up).chunk(2, dim=-1)  # [N, I] each
            x = residual(x, act(gate) * up, down_w, down_b)
        self.t += 1
        return self.model.lm_head(self._norm(x, self.model.model.norm)).float()  # [N, V]
