"""A zoo of warm-up starts: does an arm learn from every start, not only from this machine's?

The default job's start is its supervised warm-up. 1,000 Adam steps amplify the last bits in which
CPU kernels and thread counts differ, so another machine can build another start from the same
config (issue 49: held-out easy 0.340 / medium 0.250 / hard 0.165 where this machine kind builds
0.210 / 0.355 / 0.220). The zoo builds starts that differ the way machines and seeds do: the
warm-up's batch order and slip draws (`model.warmup.seed`), its length, its learning rate, its slip
share. Every start trains the GRPO run with seed 0; each arm is `python train.py <start's warm-up
overrides> <arm's overrides> seed=0`, one run at a time per job (a start's warm-up is cached by the
first arm and reused by the others). The `trl` arm trains TRL's GRPOTrainer from the same start
and evaluates it with grpo-aug's held-out evaluation (benchmarks/trl_learning.py; `.[bench]`).

    python benchmarks/start_zoo.py                                   # every start, arms default plain
    python benchmarks/start_zoo.py --starts shipped wseed1 --arms default plain bandit trl
    python benchmarks/start_zoo.py --jobs 2 --out results/start-zoo.json  # two starts at a time, 1 thread each
    python benchmarks/start_zoo.py --starts wseed3_800 --extra module.rollout.seed=1 --out rs1.json  # a repeat
    python benchmarks/start_zoo.py --table zoo.json rs1.json  # each run averaged with its repeat
    python benchmarks/start_zoo.py --starts wseed3_800 --seed 1 --out seed1.json  # the run's seed 1: see below

A repeat of a start changes only the rollout's random stream (`module.rollout.seed`): the same
start, prompts and batch order, other sampling draws (seeded runs are otherwise bit-identical).
`--seed` changes the run's seed, which also draws another synthetic task sample (pool, held-out
split) and another tiny base model before the warm-up: another start, on another sample (rows
`<start>@seed<n>`).

Final = mean of the held-out evaluations at steps 100, 150 and 200 (every 50 steps, greedy, 200
prompts per bucket); start = the step-0 evaluation. Prints one JSON line per run, then the table:
per bucket the start, each arm's final and gain, and each arm's final minus plain's; then the
run times. `--table <json>` prints the table of a saved results file; `--table <json> <json> ...`
(a run and its repeats) averages each (start, arm) found in every file and adds how far the
repeats' finals lie apart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sample_efficiency import ARMS, BUCKETS, ROOT, run_arm  # noqa: E402

sys.path.insert(0, str(ROOT / "src"))
from grpo_aug.eventlog import read_scalars  # noqa: E402

W = "model.warmup."
# Each start is the default config's warm-up with a few of its settings moved. `shipped` is the
# default itself: the start every default job loads (src/grpo_aug/warmup/starts/).
STARTS = {
    "shipped": [],
    "wseed1": [f"{W}seed=1"],
    "wseed2": [f"{W}seed=2"],
    "wseed3_800": [f"{W}seed=3", f"{W}steps=800"],
    "steps700": [f"{W}steps=700"],
    "steps500": [f"{W}steps=500"],
    "lr2e-3_800": [f"{W}lr=2.0e-3", f"{W}steps=800"],
    "slip0.8_800": [f"{W}off_by_one=0.8", f"{W}steps=800", f"{W}seed=4"],
}


def _mean(points: list[tuple[int, float]], lo: int = 0, hi: int = 10**9) -> float | None:
    values = [v for s, v in points if lo <= s <= hi]
    return statistics.mean(values) if values else None


def diagnose(run_dir: Path) -> dict:
    """What the run trained on, beside what it learned: train reward early and late, the rollouts
    per distinct prompt, completion lengths, reward per temperature rung, the share of steps per
    bucket and the KL (the candidates for a run whose train reward rises while held-out falls)."""
    scalars = read_scalars(run_dir)
    out = {"train_reward_first25": _mean(scalars.get("train/reward", []), 0, 25),
           "train_reward_last25": _mean(scalars.get("train/reward", []), 175),
           "completion_length_mean": _mean(scalars.get("health/completion_length_mean", [])),
           "kl_last": _mean(scalars.get("health/kl_mean", []), 175)}
    for tag in ("prompts/seen", "prompts/attempts_mean", "prompts/attempts_max"):
        if scalars.get(tag):
            out[tag] = max(scalars[tag])[1]  # the value at the run's last write
    for tag, points in scalars.items():
        if tag.startswith("rollout/reward_by_temperature/"):
            out["reward_T" + tag.rsplit("/", 1)[1]] = _mean(points)
    config = run_dir / ".hydra" / "config.yaml"
    if config.is_file() and yaml.safe_load(config.read_text())["data"].get("mix_buckets"):
        # mixed batches hold the weights' shares (each bucket floor or ceil of its slots)
        for b in BUCKETS:
            out[f"share_{b}"] = _mean(scalars.get(f"curriculum/weight/{b}", []))
        return out
    drawn = [int(v) for _, v in scalars.get("curriculum/bucket", [])]
    for i, b in enumerate(BUCKETS):
        if drawn:
            out[f"share_{b}"] = drawn.count(i) / len(drawn)
    return out


# TRL's GRPOTrainer from the same start, evaluated by grpo-aug (benchmarks/trl_learning.py): `trl`
# as a TRL user runs it (the whole pool, buckets mixed in every step), `trl_blocked` with each step's
# prompts from one bucket, as grpo-aug draws them
TRL_ARMS = {"trl": [], "trl_blocked": ["--one-bucket-per-step"]}


def run_trl(overrides: list[str], out: Path, flags: list[str]) -> dict:
    """A TRL arm, in its own process as every arm."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "trl_learning.py"), "--out", str(out), *flags, "--",
           *overrides]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def key(start: str, seed: int) -> str:
    """A row of the results: the start, and the GRPO seed where it is not 0 (a repeat)."""
    return start if seed == 0 else f"{start}@seed{seed}"


def run_start(start: str, arms: list[str], cache: Path, workdir: Path, extra: list[str], results: dict,
              out: Path | None, lock: threading.Lock, seed: int = 0) -> None:
    row = key(start, seed)
    for arm in arms:
        if arm in TRL_ARMS:
            run = run_trl([*STARTS[start], f"paths.cache_dir={cache}", *extra, f"seed={seed}"],
                          workdir / f"{row}-{arm}.json", TRL_ARMS[arm])
        else:
            overrides = [*STARTS[start], *ARMS[arm], f"paths.cache_dir={cache}", *extra]
            run = run_arm(overrides, seed, workdir / f"{row}-{arm}", [], val_check_interval=50)
            run["why"] = diagnose(workdir / f"{row}-{arm}")
        with lock:
            results.setdefault(row, {})[arm] = run
            print(json.dumps({"start": row, "arm": arm, **run}), flush=True)
            if out is not None:
                out.write_text(json.dumps(results, indent=1))


def mean_runs(files: list[dict]) -> dict:
    """The runs of each (start, arm) found in every results file (a run and its repeats), averaged:
    per bucket each evaluation, the final, and `spread_<bucket>`, the finals' max - min."""
    out: dict = {}
    for start, runs in files[0].items():
        for arm in runs:
            repeats = [f[start][arm] for f in files if arm in f.get(start, {})]
            if len(repeats) < len(files):
                continue
            run = {"wall_s": statistics.mean(r["wall_s"] for r in repeats), "repeats": len(repeats)}
            for b in BUCKETS:
                run[b] = [statistics.mean(v) for v in zip(*(r[b] for r in repeats), strict=True)]
                finals = [r[f"final_{b}"] for r in repeats]
                run[f"final_{b}"] = statistics.mean(finals)
                run[f"spread_{b}"] = max(finals) - min(finals)
            out.setdefault(start, {})[arm] = run
    return out


def spread_table(results: dict, arms: list[str]) -> list[str]:
    """Per arm, how far its repeats' finals lie apart (max - min per start): the mean and the widest."""
    runs = {a: [r[a] for r in results.values() if a in r and "spread_easy" in r[a]] for a in arms}
    if not any(runs.values()):
        return []
    out = ["**Repeats** (per start, max - min of the repeats' finals: mean over starts, widest)", "",
           "| arm | repeats | " + " | ".join(f"{b} spread: mean, widest" for b in BUCKETS) + " |",
           "|---" * (2 + len(BUCKETS)) + "|"]
    for a, done in runs.items():
        if done:
            cells = [f"{statistics.mean(r[f'spread_{b}'] for r in done):.3f}, "
                     f"{max(r[f'spread_{b}'] for r in done):.3f}" for b in BUCKETS]
            out.append(f"| {a} | {done[0]['repeats']} | " + " | ".join(cells) + " |")
    return [*out, ""]


def table(results: dict) -> str:
    arms = list(dict.fromkeys(a for runs in results.values() for a in runs))
    out = []
    for b in BUCKETS:
        vs = [a for a in arms if a != "plain"]
        head = ["start", "start acc", *(f"{a} final (gain)" for a in arms), *(f"{a} - plain" for a in vs)]
        out += [f"**{b}**", "", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
        for start, runs in results.items():
            first = next(iter(runs.values()))[b][0]
            cells = [f"{runs[a][f'final_{b}']:.3f} ({runs[a][f'final_{b}'] - runs[a][b][0]:+.3f})" if a in runs
                     else "" for a in arms]
            diffs = [f"{runs[a][f'final_{b}'] - runs['plain'][f'final_{b}']:+.3f}" if a in runs and "plain" in runs
                     else "" for a in vs]
            out.append(f"| {start} | {first:.3f} | " + " | ".join(cells + diffs) + " |")
        means = []
        for a in arms:
            done = [r for r in results.values() if a in r]
            means.append(f"{statistics.mean(r[a][f'final_{b}'] for r in done):.3f} "
                         f"({statistics.mean(r[a][f'final_{b}'] - r[a][b][0] for r in done):+.3f})" if done else "")
        gaps = []
        for a in vs:
            both = [r for r in results.values() if a in r and "plain" in r]
            gaps.append(f"{statistics.mean(r[a][f'final_{b}'] - r['plain'][f'final_{b}'] for r in both):+.3f}"
                        if both else "")
        out += ["| mean | | " + " | ".join(means + gaps) + " |", ""]
    out += summary_table(results, arms)
    out += spread_table(results, arms)
    out += why_table(results, arms)
    out += ["| start | " + " | ".join(f"{a} run s" for a in arms) + " |", "|---" * (1 + len(arms)) + "|"]
    for start, runs in results.items():
        out.append(f"| {start} | " + " | ".join(f"{runs[a]['wall_s']:.0f}" if a in runs else "" for a in arms) + " |")
    return "\n".join(out)


def summary_table(results: dict, arms: list[str], margin: float = 0.02) -> list[str]:
    """Per arm, over the starts it ran with plain: per bucket the mean and the worst of its final
    minus plain's, the worst final minus the start, and the (start, bucket) pairs that miss issue
    49's point 3 (more than `margin` below plain's final or below the start)."""
    if "plain" not in arms:
        return []
    head = ["arm", "starts", *(f"{b} - plain: mean, worst" for b in BUCKETS), *(f"{b} - start: worst" for b in BUCKETS),
            "misses"]
    out = [f"**Over the zoo** (final - plain: mean, worst; final - start: worst; misses of the {margin} margin)", "",
           "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for a in arms:
        runs = {k: r for k, r in results.items() if a in r and "plain" in r}
        gaps = {b: {k: r[a][f"final_{b}"] - r["plain"][f"final_{b}"] for k, r in runs.items()} for b in BUCKETS}
        falls = {b: {k: r[a][f"final_{b}"] - r[a][b][0] for k, r in runs.items()} for b in BUCKETS}
        misses = sorted({f"{k} {b}" for b in BUCKETS for k in runs
                         if gaps[b][k] < -margin or falls[b][k] < -margin})
        cells = [f"{statistics.mean(gaps[b].values()):+.3f}, {min(gaps[b].values()):+.3f}" for b in BUCKETS]
        cells += [f"{min(falls[b].values()):+.3f}" for b in BUCKETS]
        out.append(f"| {a} | {len(runs)} | " + " | ".join(cells) + f" | {len(misses)}: {', '.join(misses)} |")
    return [*out, ""]


WHY = ["train_reward_first25", "train_reward_last25", "prompts/seen", "prompts/attempts_mean", "prompts/attempts_max",
       "completion_length_mean", "share_easy", "share_medium", "share_hard", "kl_last"]


def why_table(results: dict, arms: list[str]) -> list[str]:
    """Per arm, the mean over starts of what its runs trained on (`diagnose`)."""
    runs = {a: [r[a]["why"] for r in results.values() if a in r and "why" in r[a]] for a in arms}
    if not any(runs.values()):
        return []
    rungs = sorted({k for w in runs.values() for d in w for k in d if k.startswith("reward_T")},
                   key=lambda k: float(k[len("reward_T"):]))
    keys = WHY + rungs
    out = ["**What the runs trained on** (mean over starts)", "", "| arm | " + " | ".join(keys) + " |",
           "|---" * (1 + len(keys)) + "|"]
    for a, whys in runs.items():
        cells = []
        for k in keys:
            values = [w[k] for w in whys if w.get(k) is not None]
            cells.append(f"{statistics.mean(values):.3g}" if values else "")
        out.append(f"| {a} | " + " | ".join(cells) + " |")
    return [*out, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", nargs="+", default=list(STARTS), choices=list(STARTS))
    parser.add_argument("--arms", nargs="+", default=["default", "plain"], choices=[*ARMS, *TRL_ARMS],
                        help="train.py arms of sample_efficiency.py, and trl (TRL's GRPOTrainer: .[bench])")
    parser.add_argument("--cache", type=Path, default=Path("outputs/cache"),
                        help="warm-up cache (default: the project's; earlier builds are reused)")
    parser.add_argument("--jobs", type=int, default=1, help="starts run at once, each with cores/jobs threads")
    parser.add_argument("--out", type=Path, default=None, help="JSON results file, rewritten after every run")
    parser.add_argument("--table", type=Path, nargs="+", default=None,
                        help="print the table of saved results files and exit; several files (a run and its "
                             "repeats): each (start, arm) found in all of them, averaged")
    parser.add_argument("--extra", nargs="*", default=[], help="overrides added to every run")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (data sample, base model, streams; not 0: "
                        "rows <start>@seed<n>)")
    parser.add_argument("--diagnose", type=Path, default=None,
                        help="with --table: fill each run's `why` from <dir>/<start>-<arm> (kept run directories)")
    args = parser.parse_args()
    if args.table is not None:
        files = [json.loads(path.read_text()) for path in args.table]
        if args.diagnose is not None:
            if len(files) > 1:
                parser.error("--diagnose fills one results file: give --table one file")
            for start, runs in files[0].items():
                for arm, run in runs.items():
                    if (args.diagnose / f"{start}-{arm}" / "tensorboard").is_dir():
                        run["why"] = diagnose(args.diagnose / f"{start}-{arm}")
            args.table[0].write_text(json.dumps(files[0], indent=1))
        print(table(files[0] if len(files) == 1 else mean_runs(files)))
        return
    results: dict = json.loads(args.out.read_text()) if args.out is not None and args.out.is_file() else {}
    todo = [s for s in args.starts if any(a not in results.get(key(s, args.seed), {}) for a in args.arms)]
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # each train.py child reads it
    lock = threading.Lock()
    began = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        queue = list(todo)

        def worker() -> None:
            while True:
                with lock:
                    if not queue:
                        return
                    start = queue.pop(0)
                arms = [a for a in args.arms if a not in results.get(key(start, args.seed), {})]
                run_start(start, arms, args.cache.resolve(), Path(tmp), args.extra, results, args.out, lock,
                          args.seed)

        pool = [threading.Thread(target=worker) for _ in range(args.jobs)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    print(f"{time.time() - began:.0f} s in all, {args.jobs} job(s) of {threads} thread(s)")
    print(table(results))


if __name__ == "__main__":
    main()
