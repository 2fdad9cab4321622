"""A lean decode step for Llama-family models (Llama, Mistral, Qwen2): the same math as the HF
forward, without its per-token bookkeeping.

Decoding one token through the HF model rebuilds a 4-D attention mask, grows every layer's
KV cache with torch.cat and walks generic kwargs plumbing on each call: for small models that
overhead is most of the time. Here the prompt is prefilled by the HF model itself (one call), its
keys/values are copied once into buffers sized for the whole completion, and each new token runs
through the model's own modules (norms, projections, rotary embedding, MLP) with
scaled_dot_product_attention over a slice of those buffers. Models this does not cover fall
back to the HF forward; `tests/unit/test_lean_decode.py` checks the logits against it.
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


class LeanDecoder:
    """Holds the KV buffers of one batch; `step(token)` returns the next logits [N, V]."""

    def __init__(self, model: torch.nn.Module, cache, prompt_mask: torch.Tensor, positions: torch.Tensor,
                 max_new_tokens: int) -> None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        self.rope = apply_rotary_pos_emb
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
        self.mask = valid[:, None, None, :]  # [N, 1, 1, P+T]
        # rotary cos/sin for every position a new token will take, computed once
        dummy = self.keys[0]
        self.cos, self.sin = model.model.rotary_emb(dummy, positions)  # [N, T, D]
        attn = self.layers[0].self_attn
        self.heads = model.config.num_attention_heads
        self.head_dim = attn.head_dim
        self.gqa = model.config.num_key_value_heads != self.heads
        self.t = 0

    @torch.no_grad()
    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Feed token [N] at the next position; logits [N, V] for the one after it."""
        n, at = token.shape[0], self.p + self.t
        cos, sin = self.cos[:, self.t : self.t + 1], self.sin[:, self.t : self.t + 1]  # [N, 1, D]
        mask = self.mask[..., : at + 1]  # [N, 1, 1, at+1]
        x = self.model.model.embed_tokens(token[:, None])  # [N, 1, H]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(n, 1, -1, self.head_dim).transpose(1, 2)  # [N, Hq, 1, D]
            k = attn.k_proj(h).view(n, 1, -1, self.head_dim).transpose(1, 2)  # [N, KV, 1, D]
            v = attn.v_proj(h).view(n, 1, -1, self.head_dim).transpose(1, 2)
            q, k = self.rope(q, k, cos, sin)
            self.keys[i][:, :, at : at + 1] = k
            self.values[i][:, :, at : at + 1] = v
            out = F.scaled_dot_product_attention(q, self.keys[i][:, :, : at + 1], self.values[i][:, :, : at + 1],
                                                 attn_mask=mask, scale=attn.scaling, enable_gqa=self.gqa)
            x = x + attn.o_proj(out.transpose(1, 2).reshape(n, 1, -1))  # [N, 1, H]
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.t += 1
        return self.model.lm_head(self.model.model.norm(x))[:, -1].float()  # [N, V]
