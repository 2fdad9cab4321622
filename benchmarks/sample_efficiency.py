"""Sample efficiency of the levers that act on the samples: held-out accuracy against training
seconds and rollout tokens, every arm on the same seeds, run one after another (prints JSON, then
a markdown table).

    python benchmarks/sample_efficiency.py                      # every arm, seeds 0 1 2 (~2 h on 2 cores)
    python benchmarks/sample_efficiency.py --arms plain default --seeds 0

Arms (each is `python train.py <overrides> seed=N`, the default task otherwise):
    plain     plain GRPO: one temperature 1.0, flat groups kept (no zero-std filter), no selector,
              the adaptive curriculum
    adaptive  the temperature ladder and zero-std filter with the adaptive curriculum, no selector
              (the default until 2026-12-01)
    online    adaptive + data/difficulty=online
    history   online + rollout/selector=history
    learned   online + rollout/selector=learned
    learned_os2  online + learned + rollout.oversample=2
    bandit    curriculum=bandit (buckets drawn by their share of groups with reward spread), no selector
    bandit_history  bandit + rollout/selector=history
    bandit_learned  bandit + rollout/selector=learned (the default since 2026-12-01; the learned
              selector reads the reference likelihood and ranks candidates since 2026-12-01 evening)
    bandit_learned_draw  bandit + the learned selector as it was before that: history features only,
              each candidate skipped with its flat probability, 2 replacement rounds
    default   the current default, whatever it is
    default_os2  default + rollout.oversample=2
Per run: greedy held-out accuracy per bucket at every evaluation (trainer.val_check_interval), the
training seconds (wall time since the step-0 evaluation) and rollout tokens at each, the final
accuracy (mean of the last 3 evaluations), the slip (peak minus final), rollout/flat_rows_frac
after the first evaluation interval, and the seconds to reach the plain arm's final easy (and
medium) accuracy of the same seed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from grpo_aug.eventlog import read_events  # noqa: E402

# every arm but `default` names its curriculum and selector, so that it keeps its meaning when the
# defaults move
ADAPTIVE = ["curriculum=adaptive"]
BANDIT = ["curriculum=bandit"]
NO_SELECTOR = ["rollout/selector=none"]
LEARNED = ["rollout/selector=learned"]
ONLINE = [*ADAPTIVE, "data/difficulty=online"]
ARMS = {
    "plain": [*ADAPTIVE, *NO_SELECTOR, "rollout.temperatures=[1.0]", "rollout.filter.zero_std=false"],
    "adaptive": [*ADAPTIVE, *NO_SELECTOR],
    "online": [*ONLINE, *NO_SELECTOR],
    "history": [*ONLINE, "rollout/selector=history"],
    "learned": [*ONLINE, *LEARNED],
    "learned_os2": [*ONLINE, *LEARNED, "rollout.oversample=2"],
    "bandit": [*BANDIT, *NO_SELECTOR],
    "bandit_history": [*BANDIT, "rollout/selector=history"],
    "bandit_learned": [*BANDIT, *LEARNED],
    "bandit_learned_draw": [*BANDIT, *LEARNED, "rollout.selector._target_=grpo_aug.prompts.selection.PromptSelection",
                            "~rollout.selector.max_flat", "~rollout.selector.spares", "rollout.selector.audit=0.1",
                            "+rollout.selector.max_rounds=2",
                            "rollout.selector.predictor.likelihood=false"],
    "default": [],
    "default_os2": ["rollout.oversample=2"],
}


def run_arm(overrides: list[str], seed: int, out: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "train.py", *overrides, *extra, f"seed={seed}", f"hydra.run.dir={out}"]
    start = time.time()
    # this tree's source, even when another checkout is installed in editable mode
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    events = read_events(out)
    evals = {b: sorted(events.get(f"eval/accuracy/{b}", [])) for b in ("easy", "medium")}
    t0 = evals["easy"][0][1]
    logged = sorted((s, v) for s, _, v in events.get("rollout/tokens_total", []))

    def tokens_at(step: int) -> float:  # logged every trainer.log_every_n_steps: the latest by then
        return max((v for s, v in logged if s <= step), default=0.0)

    easy = [v for _, _, v in evals["easy"]]
    flat = [v for s, _, v in events.get("rollout/flat_rows_frac", []) if s > evals["easy"][1][0]]
    return {
        "steps": [s for s, _, _ in evals["easy"]],
        "seconds": [round(w - t0, 1) for _, w, _ in evals["easy"]],
        "tokens": [tokens_at(s) for s, _, _ in evals["easy"]],
        "easy": easy,
        "medium": [v for _, _, v in evals["medium"]],
        "final_easy": statistics.mean(easy[-3:]),
        "final_medium": statistics.mean([v for _, _, v in evals["medium"]][-3:]),
        "slip": max(easy) - statistics.mean(easy[-3:]),
        "flat_rows_frac": statistics.mean(flat) if flat else None,
        "wall_s": round(time.time() - start, 1),
    }


def reach(run: dict, target: float, bucket: str = "easy") -> float | None:
    """Training seconds at the first evaluation at or above `target` (None: never)."""
    return next((s for s, a in zip(run["seconds"], run[bucket], strict=True) if a >= target), None)


def table(results: dict, seeds: list[int]) -> str:
    lines = ["| arm | easy final (per seed) | gain | slip (max) | medium final | flat_rows_frac | "
             "s to plain's final (x plain's s) | tokens to it (x plain's) | s to plain's medium final (x) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for arm, runs in results.items():
        finals = [runs[s]["final_easy"] for s in seeds]
        gains = [runs[s]["final_easy"] - runs[s]["easy"][0] for s in seeds]
        ratios, token_ratios, medium_ratios = [], [], []
        for s in seeds:
            plain = results.get("plain", {}).get(s)
            if plain is None:
                continue
            at = reach(runs[s], plain["final_easy"])
            if at is None:
                ratios.append("never")
                token_ratios.append("never")
            else:
                i = runs[s]["seconds"].index(at)
                ratios.append(f"{at / plain['seconds'][-1]:.2f}")
                token_ratios.append(f"{runs[s]['tokens'][i] / max(plain['tokens'][-1], 1):.2f}")
            at_medium = reach(runs[s], plain["final_medium"], "medium")
            medium_ratios.append("never" if at_medium is None else f"{at_medium / plain['seconds'][-1]:.2f}")
        mediums = [runs[s]["final_medium"] for s in seeds]
        flats = [runs[s]["flat_rows_frac"] for s in seeds if runs[s]["flat_rows_frac"] is not None]
        lines.append(
            f"| {arm} | {' / '.join(f'{f:.3f}' for f in finals)} | {' / '.join(f'{g:+.2f}' for g in gains)} | "
            f"{max(runs[s]['slip'] for s in seeds):.3f} | "
            f"{' / '.join(f'{m:.3f}' for m in mediums)} | "
            f"{' / '.join(f'{f:.2f}' for f in flats)} | {' / '.join(ratios)} | {' / '.join(token_ratios)} | "
            f"{' / '.join(medium_ratios)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=None, help="JSON results file (default: print only)")
    parser.add_argument("--extra", nargs="*", default=[], help="overrides added to every arm")
    args = parser.parse_args()
    results: dict[str, dict[int, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:  # seed-major: a slow machine phase hits every arm of a seed alike
            for arm in args.arms:
                run = run_arm(ARMS[arm], seed, Path(tmp) / f"{arm}-{seed}", args.extra)
                results.setdefault(arm, {})[seed] = run
                print(json.dumps({"arm": arm, "seed": seed, **run}), flush=True)
                if args.out is not None:
                    args.out.write_text(json.dumps(results, indent=1))
    print(table(results, args.seeds))


if __name__ == "__main__":
    main()
