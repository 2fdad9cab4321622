"""The GPU checks, one line each: PASS, FAIL, or SKIPPED with the reason, within a 10-minute
budget on 1-8 GPUs. Each check is a test or a run that fails when the code is wrong; the CPU ones
in CI check the same things on gloo CPU ranks.

    bash scripts/gpu_check.sh                  # on a GPU machine (exit 1 if any check failed)
    python scripts/gpu_check.py --accelerator cpu --only rank-dies   # a check's CPU form

Checks (GRPO_TEST_ACCELERATOR=gpu switches the tests to CUDA, NCCL and vLLM's CUDA engine):
    vllm-engine       tests/with_vllm on CUDA, float32: engine log-probs = the trainer's to 1e-4;
                      greedy tool transcripts equal the hf engine's
    fsdp2-update      2+ GPUs: FSDP2 and DDP updates = one process's over the same global batch
                      (one rank all flat, unequal rows, micro-batches, minibatches)
    vllm-every-rank   2+ GPUs: a vLLM engine per rank under DDP and FSDP2, gaps < 1e-4, ranks agree
    rank-dies         2+ GPUs: rank 1 SIGKILLed, and SIGSTOPped, under DDP: the survivor stops
                      within the bound naming rank, step and checkpoint
    tool-rounds       2+ GPUs: tool rounds on one rank only (rank 1 calls on every row) finish under
                      DDP and FSDP2: the other rank joins them (tests/test_tool_ranks.py)
    bf16-vs-fp32      the same step under bf16-mixed and float32: log-probs within 0.01, gradient
                      cosine > 0.99 (tests/test_bf16_step.py)
    vllm-server       tests/with_vllm/test_vllm_server.py on CUDA: a vLLM server the engine starts,
                      its log-probs = the trainer's to 1e-4 after every weight push
    ahead-speed       benchmarks/ahead.py: s/step and tokens/s, generation in step against ahead
                      (rollout.ahead=1), hf engine, vLLM colocated and a vLLM server where vLLM is
                      installed; fails when a run fails or ahead's rows are not one version old
    captured-decode   tests/unit/test_static_decode.py on CUDA: the captured decode step writes the
                      eager step's tokens (per-row temperatures, knobs, limits, stop strings)
    decode-speed      benchmarks/captured_decode.py at 270M and 820M, bf16-mixed, 128 rows x 128
                      tokens: rollout tokens/s eager and captured; fails when their tokens differ
    gpu-step          where TRL is installed: benchmarks/gpu_step.py, grpo-aug (eager and captured
                      decode) against TRL's GRPOTrainer at 270M and Qwen2.5-0.5B's shape, bf16
    default-50        the default config for 50 GRPO steps: easy accuracy gains >= 0.15 over the
                      step-0 evaluation; prints rollout and update tokens/s and peak GPU memory
    deepspeed         where deepspeed is installed: trainer=deepspeed (ZeRO-3) trains 4 steps
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 600
TINY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64"]
EASY_GAIN = 0.15  # the default run gains ~0.45 on easy by step 50 (README); a broken update gains ~0


def gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *args]


def default_run(accelerator: str, out: Path) -> list[str]:
    """50 GRPO steps of the default config, evaluated at 0 and 50 (warm-up from the cache or built)."""
    trainer = ["trainer=gpu"] if accelerator == "gpu" else []
    return [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--default-run", str(out), *trainer]


def checks(accelerator: str, work: Path) -> list[tuple[str, str | None, list[str], int]]:
    """(name, why it is skipped or None, command, timeout in s)."""
    n, on_gpu = gpus(), accelerator == "gpu"
    two = None if not on_gpu or n >= 2 else f"needs 2 GPUs, this machine has {n}"
    vllm = None if has("vllm") else "vLLM is not installed (pip install vllm)"
    return [
        ("vllm-engine", vllm, pytest("tests/with_vllm", "-m", "vllm and not slow"), 240),
        ("fsdp2-update", two, pytest("-m", "slow", "tests/test_lockstep_ranks.py"), 180),
        ("vllm-every-rank", two or vllm, pytest("-m", "vllm and slow", "tests/with_vllm/test_vllm_ranks.py", "-k",
                                                "every_rank"), 300),
        ("rank-dies", two, pytest("-m", "slow", "tests/test_rank_failure.py", "-k",
                                  "a_rank_that_dies and ddp and rank1"), 300),
        ("tool-rounds", two, pytest("-m", "slow", "tests/test_tool_ranks.py", "-k", "one_rank_only"), 200),
        ("bf16-vs-fp32", None, pytest("tests/test_bf16_step.py"), 120),
        ("vllm-server", vllm, pytest("tests/with_vllm/test_vllm_server.py", "-m", "vllm and not slow"), 200),
        ("ahead-speed", None, [sys.executable, str(ROOT / "benchmarks" / "ahead.py"), "--accelerator", accelerator,
                               "--steps", "10"], 240),
        ("captured-decode", None, pytest("tests/unit/test_static_decode.py"), 120),
        ("decode-speed", None if on_gpu else "the captured graph needs CUDA",
         ["bash", "-c", " && ".join(f"{sys.executable} {ROOT / 'benchmarks' / 'captured_decode.py'} --shape {shape}"
                                    for shape in ("270m", "820m"))], 240),
        ("gpu-step", None if has("trl") else "TRL is not installed (pip install -e '.[bench]'; docs/scaling.md)",
         [sys.executable, str(ROOT / "benchmarks" / "gpu_step.py"), "--device", "cuda" if on_gpu else "cpu",
          *([] if on_gpu else ["--shapes", "tiny", "--steps", "3", "--warmup", "1"])], 300),
        ("default-50", None, default_run(accelerator, work / "default"), 420),
        ("deepspeed", None if has("deepspeed") else "deepspeed is not installed (pip install deepspeed)",
         [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={work / 'deepspeed'}", "debug=fast", *TINY,
          "trainer=deepspeed", "trainer.devices=1", "algo.beta.value=0"], 240),
    ]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--accelerator", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--only", nargs="*", help="run these checks only")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for every check together")
    parser.add_argument("--default-run", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("trainer", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.default_run is not None:
        return run_default(args.default_run, args.trainer)
    if args.accelerator == "gpu" and gpus() == 0:
        print("FAIL  cuda: no CUDA device (run with --accelerator cpu for the CPU forms)")
        return 1
    env = dict(os.environ, GRPO_TEST_ACCELERATOR=args.accelerator, HF_HUB_OFFLINE="1")
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"grpo-gpu-check-{os.getpid()}"
    deadline = time.time() + args.budget
    failed = 0
    for name, skip, command, timeout in checks(args.accelerator, work):
        if args.only and name not in args.only:
            continue
        left = deadline - time.time()
        if skip is None and left < 30:
            skip = "no time left in the 10-minute budget"
        if skip is not None:
            print(f"SKIPPED  {name}: {skip}", flush=True)
            continue
        start = time.time()
        try:
            out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                                 timeout=min(timeout, left))
            ok, tail = out.returncode == 0, (out.stdout + out.stderr).strip().splitlines()
        except subprocess.TimeoutExpired:
            ok, tail = False, [f"timed out after {min(timeout, left):.0f} s"]
        failed += not ok
        figures = [line for line in tail if line.startswith("{")]
        detail = figures[-1] if figures else (tail[-1] if tail else "")
        print(f"{'PASS' if ok else 'FAIL'}  {name} ({time.time() - start:.0f} s): {detail[:400]}", flush=True)
        for line in figures[:-1] + [line for line in tail if line.startswith("|")]:  # a benchmark's rows and table
            print("    " + line, flush=True)
        if not ok:
            print("\n".join("    " + line for line in tail[-25:]), flush=True)
    return 1 if failed else 0


def run_default(out: Path, trainer: list[str]) -> int:
    """The default-50 check: 50 steps of the default config, with the rollout and update stages timed
    (their tokens per second) and the GPU's peak memory; exit 1 unless easy gains EASY_GAIN."""
    import lightning as L
    import torch

    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
    from grpo_aug.pipeline import build
    from helpers import compose_cfg

    cfg = compose_cfg(out, [*trainer, "trainer.max_steps=50", "trainer.val_check_interval=50",
                            f"paths.cache_dir={ROOT / 'outputs' / 'cache'}"])
    L.seed_everything(cfg.seed, workers=True)
    trainer_, module, datamodule = build(cfg)
    times = {"rollout_s": 0.0, "rollout_tokens": 0, "update_s": 0.0, "update_tokens": 0}
    sample, train = module.sample_groups, module.update.train

    def timed_sample(*a, **k):
        start = time.perf_counter()
        picked, sampled, curriculum = sample(*a, **k)
        times["rollout_s"] += time.perf_counter() - start
        times["rollout_tokens"] += sampled.tokens
        return picked, sampled, curriculum

    def timed_train(policy, step, handle):
        start = time.perf_counter()
        result = train(policy, step, handle)
        times["update_s"] += time.perf_counter() - start
        times["update_tokens"] += int(step.rollout.attention_mask.sum())
        return result

    module.sample_groups, module.update.train = timed_sample, timed_train
    trainer_.validate(module, datamodule=datamodule, verbose=False)
    start = dict(module.last_eval)
    trainer_.fit(module, datamodule=datamodule)
    end = module.last_eval
    gain = end["eval/accuracy/easy"] - start["eval/accuracy/easy"]
    print(json.dumps({"easy_start": start["eval/accuracy/easy"], "easy_step50": end["eval/accuracy/easy"],
                      "rollout_tokens_per_s": round(times["rollout_tokens"] / times["rollout_s"]),
                      "update_tokens_per_s": round(times["update_tokens"] / times["update_s"]),
                      "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
                      if torch.cuda.is_available() else None}))
    return 0 if gain >= EASY_GAIN else 1


if __name__ == "__main__":
    sys.exit(main())
