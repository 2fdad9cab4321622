"""The built-in offline model: a character tokenizer and a small Llama built from config.

Both are written with `save_pretrained` and read back by the same `from_pretrained` path real
models use, so the default run exercises the user's code path without a model hub.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from grpo_aug.models.loading import save_pretrained_dir

SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
# printable ASCII and newline cover the synthetic task and nearly all of GSM8K
CHARS = [chr(i) for i in range(32, 127)] + ["\n"]


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIAL + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def build_tiny_model(
    cache_dir: str | Path,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 512,
    max_position_embeddings: int = 512,
    seed: int = 0,
) -> Path:
    """Create (once) and return a directory holding the tiny tokenizer and random-init model."""
    spec = dict(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings,
                seed=seed, vocab=len(SPECIAL) + len(CHARS))
    key = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    out = Path(cache_dir) / f"tiny-llama-{key}"
    if (out / "config.json").is_file():
        return out
    tokenizer = build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return save_pretrained_dir(model, tokenizer, out)
