"""The hf engine's rollout with and without the captured decode step (prints one JSON line per arm).

    python benchmarks/captured_decode.py --shape 270m --precision bf16-mixed     # on a GPU (issue 50)
    python benchmarks/captured_decode.py --shape tiny --device cpu               # the same code on a CPU

A random-init Llama of the shape given generates `--rows` rows (the default task's 16 prompts x 8)
of up to `--tokens` tokens through `grpo_aug.engines.sampling.generate`, once eagerly
(`static=False`) and once with the fixed-shape step (`static=True`: one captured CUDA graph per
rollout on a GPU; eager at fixed shapes on a CPU). Both draw from the same seeded stream, so they
write the same tokens: `same_tokens` says whether they did (exit 1 when not). Each arm runs `--repeats` rollouts
after one untimed one; tokens/s counts the tokens the rows wrote.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_step import SHAPES  # noqa: E402


def build(shape: str, device: str, dtype: torch.dtype):
    """gpu_step.py's shape (one table for both benchmarks), in memory, with the tiny character tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo_aug.models.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    w = SHAPES[shape]
    config = LlamaConfig(vocab_size=len(tok), hidden_size=w["hidden"], num_hidden_layers=w["layers"],
                         num_attention_heads=w["heads"], num_key_value_heads=w.get("kv_heads", w["heads"]),
                         intermediate_size=w["intermediate"], max_position_embeddings=1024,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval(), tok


def rollout(model, tok, rows: int, tokens: int, static: bool, precision: str, device: str):
    from grpo_aug.engines.sampling import generate

    prompts = [f"Q: What is {i} + {2 * i + 1}?\nA: " for i in range(rows // 8) for _ in range(8)]
    temperatures = torch.tensor([0.7, 1.0, 1.2, 1.5] * (rows // 4))
    autocast = (torch.autocast(device_type=device, dtype=torch.bfloat16) if precision == "bf16-mixed"
                else contextlib.nullcontext())
    generator = torch.Generator(device=device).manual_seed(1)
    with autocast:
        out = generate(model, tok, prompts, temperatures, 1.0, tokens, generator=generator, static=static)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=["tiny", "270m", "820m"], default="270m")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", choices=["32", "bf16-mixed", "bf16"], default="bf16-mixed")
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    model, tok = build(args.shape, args.device, dtype)
    results = {}
    for static in (False, True):
        first = rollout(model, tok, args.rows, args.tokens, static, args.precision, args.device)
        if args.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        began, written = time.perf_counter(), 0
        for _ in range(args.repeats):
            out = rollout(model, tok, args.rows, args.tokens, static, args.precision, args.device)
            written += int(out.completion_mask.sum())
        if args.device == "cuda":
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - began) / args.repeats
        results[static] = first
        line = {"shape": args.shape, "precision": args.precision, "device": args.device, "static": static,
                "rows": args.rows, "tokens": args.tokens, "seconds_per_rollout": round(seconds, 4),
                "tokens_per_s": round(written / args.repeats / seconds, 1)}
        if args.device == "cuda":
            line["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        print(json.dumps(line), flush=True)
    same = torch.equal(results[False].input_ids, results[True].input_ids)
    print(json.dumps({"same_tokens": same}), flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
