"""Held-out curves of train.py runs judged at equal wall time (docs/real-model.md's arms).

Each arm is a train.py run stopped from outside a little after the budget, its start time taken
just before it was launched:

    date +%s > default_s0.start
    timeout -k 60 -s INT 1900 python train.py experiment=smollm2_arith trainer.max_steps=140 \
        hydra.run.dir=runs/default_s0
    python benchmarks/timed_runs.py --budget 1800 --out arms.json default_s0=runs/default_s0@$(cat default_s0.start)

For each run: every evaluation (step, seconds since the start, accuracy per bucket) from its
TensorBoard events; `final`: per bucket, the mean of the last three evaluations after step 0 made
within the budget (the summary's rule, cut at equal wall time); `flat_rows_mean`: the mean of
`rollout/flat_rows_frac` over the steps logged within the budget. Events written before the start
(an earlier run in the same folder) are left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from grpo_aug.data.records import BUCKETS  # noqa: E402
from grpo_aug.eventlog import read_events  # noqa: E402
from grpo_aug.summary import FINAL_OF  # noqa: E402


def judge(run_dir: Path, start: float, budget: float) -> dict:
    # a reused run folder keeps an earlier run's event files: only what this run wrote counts
    events = {tag: [e for e in es if e[1] >= start] for tag, es in read_events(run_dir).items()}
    missing = [b for b in BUCKETS if f"eval/accuracy/{b}" not in events]
    if missing:
        raise SystemExit(f"{run_dir}: no eval/accuracy/{missing[0]} in its TensorBoard events")
    by_step: dict[int, dict] = {}
    for bucket in BUCKETS:
        for step, wall, value in events[f"eval/accuracy/{bucket}"]:
            row = by_step.setdefault(step, {"step": step, "seconds": round(wall - start)})
            row[bucket] = round(value, 4)
    evals = [by_step[s] for s in sorted(by_step)]
    within = [e for e in evals if e["step"] > 0 and e["seconds"] <= budget][-FINAL_OF:]
    flat = [v for _, wall, v in events.get("rollout/flat_rows_frac", []) if wall - start <= budget]
    return {
        "evals": evals,
        "final_steps": [e["step"] for e in within],
        "final": [round(statistics.fmean(e[b] for e in within), 3) for b in BUCKETS] if within else None,
        "flat_rows_mean": round(statistics.fmean(flat), 4) if flat else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="NAME=RUN_DIR@START_EPOCH_SECONDS")
    parser.add_argument("--budget", type=float, default=1800.0, help="seconds of wall time each arm is judged at")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    out = {}
    for spec in args.runs:
        name, sep, rest = spec.partition("=")
        run_dir, at, start = rest.rpartition("@")
        if not (sep and at and name):
            raise SystemExit(f"run {spec!r}: expected NAME=RUN_DIR@START_EPOCH_SECONDS")
        out[name] = judge(Path(run_dir), float(start), args.budget)
        print(name, out[name]["final"], out[name]["flat_rows_mean"], out[name]["final_steps"])
    args.out.write_text(json.dumps({"budget_s": args.budget, "runs": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
