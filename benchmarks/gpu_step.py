"""grpo-aug against TRL's GRPOTrainer on one GPU: seconds per step, rollout and update tokens/s,
peak GPU memory (prints one JSON line per arm and shape, then the ratios).

    pip install -e ".[bench]"                        # TRL (and datasets), for the comparison only
    python benchmarks/gpu_step.py                    # both shapes, every arm, on CUDA
    python benchmarks/gpu_step.py --shapes 270m --arms grpo_aug grpo_aug_captured
    python benchmarks/gpu_step.py --device cpu --shapes tiny --steps 3 --warmup 1   # the code path on a CPU

Both trainers get the same random-init Llama (benchmarks/trainer_step.py's `build_model`, a
character tokenizer padded with filler tokens to the shape's vocabulary), the same prompts
(`12+7=`), the same reward (the share of digits), G = 8, 16 prompts per step (the default task's
sizes), up to 64 new tokens, beta 0.04, one update per rollout, bf16 (grpo-aug: Lightning's
`bf16-mixed`; TRL: `bf16=True`, its autocast). TRL generates with transformers' `generate` (no
vLLM on the H200 image); grpo-aug with the hf engine, eager (`grpo_aug`) and with the captured
CUDA-graph decode (`grpo_aug_captured`, rollout.engine.captured_decode; on a CPU the engine does
not capture, so the two grpo-aug arms run the same code there). Shapes:

    270m      hidden 1024, 16 layers, 16 heads, intermediate 4096, 19-token vocabulary (issue 50's)
    820m      hidden 2048, 16 layers, 16 heads, intermediate 5632 (issue 50's larger shape)
    qwen0.5b  Qwen2.5-0.5B's: hidden 896, 24 layers, 14 heads (2 KV), intermediate 4864,
              vocabulary 151,936, tied embeddings
    tiny      trainer_step.py's tiny workload (a smoke run on a CPU)

Rollout tokens/s: completion tokens written / the seconds in the engine's generate; update tokens/s:
completion tokens / the rest of the step (scoring, reference, backward, optimizer). Medians over
the steps after `--warmup`; each arm runs in its own process (its own peak memory).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trainer_step  # noqa: E402

SHAPES = {
    "270m": dict(layers=16, hidden=1024, intermediate=4096, heads=16, new_tokens=64),
    "qwen0.5b": dict(layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, vocab=151_936, tied=True,
                     new_tokens=64),
    "820m": dict(layers=16, hidden=2048, intermediate=5632, heads=16, new_tokens=64),  # issue 50's larger shape
    "tiny": dict(trainer_step.WORKLOADS["tiny"]),
}
ARMS = ["grpo_aug", "grpo_aug_captured", "trl"]
PROMPTS = 16  # x G = 8 rows: the default task's step


def child(arm: str, shape: str, model_dir: str, steps: int, device: str) -> None:
    import torch

    trainer_step.PROMPTS = PROMPTS
    torch.manual_seed(0)
    dims, gpu = SHAPES[shape], device == "cuda"
    if arm == "trl":
        result = trainer_step.run_trl(Path(model_dir), shape, steps, dims=dims, gpu=gpu)
    else:
        result = trainer_step.run_grpo_aug(Path(model_dir), shape, steps, dims=dims,
                                           accelerator="gpu" if gpu else "cpu",
                                           precision="bf16-mixed" if gpu else "32-true",
                                           captured=arm == "grpo_aug_captured")
        result["generate_seconds"] = [b.get("generate", 0.0) for b in result.pop("breakdown")]
    result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if gpu else None
    print("RESULT " + json.dumps(result))


def summary(result: dict, warmup: int) -> dict:
    steps = result["step_seconds"][warmup:]
    gen = result["generate_seconds"][warmup:]
    tokens = [length * PROMPTS * trainer_step.GROUP for length in result["completion_length"][warmup:]]
    return {"median_step_s": round(statistics.median(steps), 4),
            "rollout_tokens_per_s": round(statistics.median(t / g for t, g in zip(tokens, gen, strict=True)), 1),
            "update_tokens_per_s": round(statistics.median(t / (s - g) for t, s, g in
                                                            zip(tokens, steps, gen, strict=True)), 1),
            "mean_completion_tokens": round(statistics.mean(result["completion_length"][warmup:]), 1),
            "peak_gib": None if result["peak_gib"] is None else round(result["peak_gib"], 2)}


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["270m", "qwen0.5b"])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=ARMS)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--shape", choices=list(SHAPES), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.shape, args.model, args.steps, args.device)
        return 0
    failed = 0
    for shape in args.shapes:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = trainer_step.build_model(shape, Path(tmp) / "model", dims=SHAPES[shape])
            rows = {}
            for arm in args.arms:
                proc = subprocess.run([sys.executable, __file__, "--child", arm, "--shape", shape, "--model",
                                       str(model_dir), "--steps", str(args.steps), "--device", args.device],
                                      capture_output=True, text=True)
                lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
                if proc.returncode != 0 or not lines:
                    failed += 1
                    print(json.dumps({"shape": shape, "arm": arm, "failed": proc.stderr.strip()[-600:]}), flush=True)
                    continue
                rows[arm] = summary(json.loads(lines[-1][len("RESULT "):]), args.warmup)
                print(json.dumps({"shape": shape, "arm": arm, "device": args.device, **rows[arm]}), flush=True)
        if "trl" in rows:
            ratios = {f"{arm}_step_over_trl": round(rows[arm]["median_step_s"] / rows["trl"]["median_step_s"], 3)
                      for arm in rows if arm != "trl"}
            print(json.dumps({"shape": shape, **ratios}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
