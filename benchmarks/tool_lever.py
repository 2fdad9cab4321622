"""What the calculator tool buys on the default task: each run's held-out accuracy at every
evaluation and how its tool use moved, from the runs' own TensorBoard events.

    for seed in 0 1 2; do python train.py rollout/tools=calculator seed=$seed \\
        hydra.run.dir=outputs/tools/calc-seed$seed; done
    python benchmarks/tool_lever.py outputs/tools/calc-seed0 outputs/tools/calc-seed1 outputs/tools/calc-seed2

Prints, per run: eval/accuracy/<bucket> at each evaluation, the final (mean of the last three, as
the run summary computes it), tools/call_frequency at its first three and last three points,
tools/calls_per_row and tools/failure_frequency at the end, and the run's time split. A run
without tools (the control arm: `model.warmup.off_by_one=0.49`, the share of slipped
demonstrations the tool runs' warm-up has, 0.7 x 0.7) prints its accuracies only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from grpo_aug.eventlog import read_scalars

BUCKETS = ("easy", "medium", "hard")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+")
    for run in parser.parse_args().runs:
        scalars = read_scalars(run)
        print(run)
        summary = json.loads((run / "summary.json").read_text())
        print("  seconds " + ", ".join(f"{k} {v:.0f}" for k, v in summary["seconds"].items()))
        for bucket in BUCKETS:
            points = scalars[f"eval/accuracy/{bucket}"]
            final = sum(v for _, v in points[-3:]) / len(points[-3:])
            print(f"  {bucket:<6} " + "  ".join(f"@{s} {v:.3f}" for s, v in points) + f"   final {final:.3f}")
        if "tools/call_frequency" not in scalars:  # a run without tools (a control arm)
            print("  no tools")
            continue
        calls = [v for _, v in scalars["tools/call_frequency"]]
        print("  tools/call_frequency  first " + " ".join(f"{v:.2f}" for v in calls[:3]) +
              "  last " + " ".join(f"{v:.2f}" for v in calls[-3:]))
        for tag in ("tools/calls_per_row", "tools/failure_frequency", "tools/token_share"):
            print(f"  {tag} at the end {scalars[tag][-1][1]:.3f}")


if __name__ == "__main__":
    main()
