"""Learning per step and per second, generation in step against generation ahead, on the default task:
each run's held-out accuracy at every evaluation with the seconds since its step-0 evaluation, the
final (mean of the last three evaluations, as the run summary computes it) and the GRPO seconds.

    for seed in 0 1 2; do for k in 0 1; do python train.py seed=$seed rollout.ahead=$k \\
        hydra.run.dir=outputs/ahead/seed$seed-ahead$k; done; done
    python benchmarks/ahead_learning.py outputs/ahead/seed*-ahead*

With rollout.ahead=k, evaluations come k optimizer steps earlier (trainer.val_check_interval counts
training calls, and the first k calls only fill the queue): @49 instead of @50.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

BUCKETS = ("easy", "medium", "hard")


def points(run: Path, tag: str) -> list[tuple[int, float, float]]:
    """(step, value, wall time) of every point of `tag` in the run's event files."""
    out = {}
    for f in sorted((run / "tensorboard").glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f))
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            out.update({e.step: (e.step, e.value, e.wall_time) for e in acc.Scalars(tag)})
    return [out[s] for s in sorted(out)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+")
    rows = []
    for run in parser.parse_args().runs:
        summary = json.loads((run / "summary.json").read_text())
        evals = {b: points(run, f"eval/accuracy/{b}") for b in BUCKETS}
        start = evals["easy"][0][2]
        print(run, f"GRPO {summary['seconds']['grpo']:.0f} s")
        for i, (step, _, wall) in enumerate(evals["easy"]):
            accuracies = "  ".join(f"{b} {evals[b][i][1]:.3f}" for b in BUCKETS)
            print(f"  @{step:<4} {wall - start:6.0f} s   {accuracies}")
        final = {b: sum(v for _, v, _ in evals[b][-3:]) / 3 for b in BUCKETS}
        rows.append((run.name, summary["seconds"]["grpo"], final))
    print("| run | GRPO s | final easy | final medium | final hard |")
    print("|---|---|---|---|---|")
    for name, seconds, final in rows:
        print(f"| {name} | {seconds:.0f} | " + " | ".join(f"{final[b]:.3f}" for b in BUCKETS) + " |")


if __name__ == "__main__":
    main()
