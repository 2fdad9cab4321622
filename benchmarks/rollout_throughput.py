"""Rollout throughput: grpo-aug's batched per-row-temperature sampler vs the alternatives.

    python benchmarks/rollout_throughput.py            # prints one JSON object

(a) naive: one HF `generate` call per row, temperatures cycling 0.7/1.0/1.2/1.5, top-p 0.95
    (the seed document's `group_sample`);
(b) hf_batched: one HF `generate` call for all rows at a single temperature;
(c) grpo_aug: one call of grpo_aug.engines.sampling for all rows, each row at its own temperature.
Same tiny model (the default `model=tiny` architecture, random weights), same prompts. Figures
are medians over repeats; compare ratios from one run, absolute numbers move with the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.engines.sampling import generate
from grpo_aug.models.loading import load_policy, load_tokenizer
from grpo_aug.models.tiny import build_tiny_model

LADDER = (0.7, 1.0, 1.2, 1.5)


def naive(model, tok, prompts, group, new_tokens):
    tokens = 0
    for prompt in prompts:
        enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
        for g in range(group):
            out = model.generate(**enc, do_sample=True, temperature=LADDER[g % 4], top_p=0.95,
                                 max_new_tokens=new_tokens, pad_token_id=tok.pad_token_id)
            tokens += out.shape[1] - enc.input_ids.shape[1]
    return tokens


def hf_batched(model, tok, prompts, group, new_tokens):
    rows = [p for p in prompts for _ in range(group)]
    enc = tok(rows, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=0.95, max_new_tokens=new_tokens,
                         pad_token_id=tok.pad_token_id)
    completion = out[:, enc.input_ids.shape[1]:]
    ended = (completion == tok.eos_token_id).cumsum(1) - (completion == tok.eos_token_id).long()
    return int((ended == 0).sum())  # tokens up to and including the first EOS


def ours(model, tok, prompts, group, new_tokens):
    rows = [p for p in prompts for _ in range(group)]
    temps = torch.tensor([LADDER[g % 4] for g in range(group)]).repeat(len(prompts))
    return int(generate(model, tok, rows, temps, 0.95, new_tokens).completion_mask.sum())


def measure(fn, repeats, *args):
    times, tokens = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times), tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as cache:
        path = str(build_tiny_model(cache))
        model, tok = load_policy(path), load_tokenizer(path)
    model.eval()
    prompts = [r.prompt for r in SyntheticArithmetic(size_per_bucket=8, seed=0).load() if r.bucket == "easy"]
    results = []
    with torch.inference_mode():
        for group, new_tokens in ((8, 16), (16, 32)):
            ours(model, tok, prompts, group, new_tokens)  # warm-up
            row = {"prompts": len(prompts), "group_size": group, "new_tokens": new_tokens}
            for name, fn, repeats in (("naive", naive, 1), ("hf_batched", hf_batched, args.repeats),
                                      ("grpo_aug", ours, args.repeats)):
                seconds, tokens = measure(fn, repeats, model, tok, prompts, group, new_tokens)
                row[name] = {"seconds": round(seconds, 4), "tokens_per_s": round(tokens / seconds, 1),
                             "rows_per_s": round(len(prompts) * group / seconds, 1)}
            row["speedup_vs_naive"] = round(row["naive"]["seconds"] / row["grpo_aug"]["seconds"], 1)
            row["time_vs_hf_batched_single_temperature"] = round(
                row["grpo_aug"]["seconds"] / row["hf_batched"]["seconds"], 3)
            results.append(row)
    print(json.dumps({"torch_threads": args.threads, "results": results}, indent=2))


if __name__ == "__main__":
    main()
