"""A tiny Llama written as a GGUF file the way llama.cpp's converter writes one (byte-level BPE
tokenizer with merges, chat template, q/k rows permuted for its RoPE layout), from a transformers
model that the tests keep as the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                 "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                 "{% endif %}")


def byte_chars() -> list[str]:
    """GPT-2's byte-to-character table: every byte as one printable character."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[str]]:
    """Tokens (specials, the 256 byte characters, a few merged pieces) and the merges that make them."""
    merges = ["Ġ t", "Ġ a", "i s", "Ġ =", "1 2"]
    tokens = SPECIAL + byte_chars() + [m.replace(" ", "") for m in merges]
    return tokens, merges


def permute_for_gguf(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter reorders each head's q/k rows (its RoPE pairs neighbours, HF's halves)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, seed: int = 0) -> LlamaForCausalLM:
    """Write a 2-layer Llama with the vocabulary above to `path`; return the model it holds."""
    import gguf

    tokens, merges = vocabulary()
    config = LlamaConfig(vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # not all ones: a norm lost in conversion would show
                p.uniform_(0.5, 1.5)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_rope_dimension_count(16)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    writer.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"].numpy())
    writer.add_tensor("output_norm.weight", sd["model.norm.weight"].numpy())
    for i in range(2):
        for hf, ours in names.items():
            w = sd[f"model.layers.{i}.{hf}.weight"]
            if ours == "attn_q":
                w = permute_for_gguf(w, 4)
            elif ours == "attn_k":
                w = permute_for_gguf(w, 2)
            writer.add_tensor(f"blk.{i}.{ours}.weight", np.ascontiguousarray(w.numpy()))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model
