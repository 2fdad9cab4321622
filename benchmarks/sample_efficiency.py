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
    online    adaptive + prompts/difficulty=online
    history   online + prompts/selector=history
    learned   online + prompts/selector=learned
    learned_os2  online + learned + rollout.oversample=2
    bandit    prompts/curriculum=bandit (buckets drawn by their share of groups with reward spread), no selector
              (the default since 2026-12-04)
    bandit_history  bandit + prompts/selector=history
    bandit_learned  bandit + prompts/selector=learned (the default 2026-12-01 to 12-04; the learned
              selector reads the reference likelihood and ranks candidates since 2026-12-01 evening)
    bandit_learned_draw  bandit + the learned selector as it was before that: history features only,
              each candidate skipped with its flat probability, 2 replacement rounds
    default   the current default, whatever it is
    default_os2  default + rollout.oversample=2
    guided    default + rollout/reflect=prefix (all-wrong groups get rows that start inside the reference)
    frontier  guided + prompts.curriculum.predicted=true (the bandit reads the selector's predicted spread)
    budget    default + rollout/budget=informative (each step's rows shared out by predicted pass rate)
Per run: greedy held-out accuracy per bucket at every evaluation (every 25 steps), the training
seconds (wall time since the step-0 evaluation) and rollout tokens at each; per bucket the final
accuracy (mean of the last 3 evaluations), the area under the accuracy curve (as a mean accuracy),
the slip (peak minus final) and the seconds and tokens to reach the plain arm's final of the same
seed; rollout/flat_rows_frac after the first evaluation interval.
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

from grpo_aug.data.records import BUCKETS  # noqa: E402
from grpo_aug.eventlog import read_events  # noqa: E402

# every arm but `default` (and the arms that add one lever to it) names its curriculum, selector and
# batch sampling, so that it keeps its meaning when the defaults move
ONE = ["data.mix_buckets=false", "data.without_replacement=false"]  # one bucket per batch, prompts at random
MIXED = ["data.mix_buckets=true", "data.without_replacement=false"]  # mixed batches, prompts at random
MIXED_WOR = ["data.mix_buckets=true", "data.without_replacement=true"]  # mixed, prompts in passes (TRL's way)
ADAPTIVE = ["prompts/curriculum=adaptive"]
BANDIT = ["prompts/curriculum=bandit"]
NO_SELECTOR = ["prompts/selector=none"]
LEARNED = ["prompts/selector=learned"]
ONLINE = [*ADAPTIVE, "prompts/difficulty=online"]
# the buckets a third each over the whole run
THIRDS = ["prompts/curriculum=staged",
          "prompts.curriculum.stages=[{until:1.0,weights:{easy:0.34,medium:0.33,hard:0.33}}]"]
ARMS = {
    "plain": [*ADAPTIVE, *NO_SELECTOR, "rollout.temperatures=[1.0]", "rollout.filter.zero_std=false", *ONE],
    # plain, its buckets drawn a third each (one bucket per batch): TRL's whole-pool shares
    "uniform": [*THIRDS,
                *NO_SELECTOR, "rollout.temperatures=[1.0]", "rollout.filter.zero_std=false", *ONE],
    "adaptive": [*ADAPTIVE, *NO_SELECTOR, *ONE],
    # mixed batches (data.mix_buckets): every batch holds the buckets in the curriculum's shares
    "plain_mixed": [*ADAPTIVE, *NO_SELECTOR, "rollout.temperatures=[1.0]", "rollout.filter.zero_std=false", *MIXED],
    "uniform_mixed": [*THIRDS,
                      *NO_SELECTOR, "rollout.temperatures=[1.0]", "rollout.filter.zero_std=false", *MIXED],
    "bandit_mixed": [*BANDIT, *NO_SELECTOR, *MIXED],
    # ... and each bucket's prompts without replacement (data.without_replacement): TRL's sampling
    "uniform_mixed_wor": [*THIRDS,
                          *NO_SELECTOR, "rollout.temperatures=[1.0]", "rollout.filter.zero_std=false", *MIXED_WOR],
    "bandit_mixed_wor": [*BANDIT, *NO_SELECTOR, *MIXED_WOR],
    # ... with a larger exploration share: every bucket gets at least explore / 3 of each batch
    "bandit_mixed_wor_e30": [*BANDIT, "prompts.curriculum.explore=0.3", *NO_SELECTOR, *MIXED_WOR],
    "bandit_mixed_wor_e45": [*BANDIT, "prompts.curriculum.explore=0.45", *NO_SELECTOR, *MIXED_WOR],
    "bandit_wor": [*BANDIT, *NO_SELECTOR, "data.mix_buckets=false", "data.without_replacement=true"],
    "plain_ladder": [*ADAPTIVE, *NO_SELECTOR, "rollout.filter.zero_std=false", *ONE],  # plain + the ladder
    "plain_filter": [*ADAPTIVE, *NO_SELECTOR, "rollout.temperatures=[1.0]", *ONE],  # plain + the zero-std filter
    "online": [*ONLINE, *NO_SELECTOR, *ONE],
    "history": [*ONLINE, "prompts/selector=history", *ONE],
    "learned": [*ONLINE, *LEARNED, *ONE],
    "learned_os2": [*ONLINE, *LEARNED, "rollout.oversample=2", *ONE],
    "bandit": [*BANDIT, *NO_SELECTOR, *ONE],
    "bandit_t1": [*BANDIT, *NO_SELECTOR, "rollout.temperatures=[1.0]", *ONE],  # `bandit` without its ladder
    "bandit_history": [*BANDIT, "prompts/selector=history", *ONE],
    "bandit_learned": [*BANDIT, *LEARNED, *ONE],
    "bandit_learned_draw": [*BANDIT, *LEARNED, "prompts.selector._target_=grpo_aug.prompts.selection.PromptSelection",
                            "~prompts.selector.max_flat", "~prompts.selector.spares", "prompts.selector.audit=0.1",
                            "+prompts.selector.max_rounds=2",
                            "prompts.selector.predictor.likelihood=false", *ONE],
    "default": [],
    "default_os2": ["rollout.oversample=2"],
    "guided": ["rollout/reflect=prefix"],
    "frontier": ["rollout/reflect=prefix", "prompts.curriculum.predicted=true"],
    "budget": ["rollout/budget=informative"],
}


def run_arm(overrides: list[str], seed: int, out: Path, extra: list[str], val_check_interval: int = 25) -> dict:
    # evaluations every 25 steps: every arm nears its easy final by step 50
    cmd = [sys.executable, "train.py", f"trainer.val_check_interval={val_check_interval}", *overrides, *extra,
           f"seed={seed}",
           f"hydra.run.dir={out}"]
    start = time.time()
    # this tree's source, even when another checkout is installed in editable mode
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    events = read_events(out)
    evals = {b: sorted(events.get(f"eval/accuracy/{b}", [])) for b in BUCKETS}
    t0 = evals["easy"][0][1]
    logged = sorted((s, v) for s, _, v in events.get("rollout/tokens_total", []))

    def tokens_at(step: int) -> float:  # logged every trainer.log_every_n_steps: the latest by then
        return max((v for s, v in logged if s <= step), default=0.0)

    steps = [s for s, _, _ in evals["easy"]]
    flat = [v for s, _, v in events.get("rollout/flat_rows_frac", []) if s > steps[1]]
    run = {
        "steps": steps,
        "seconds": [round(w - t0, 1) for _, w, _ in evals["easy"]],
        "tokens": [tokens_at(s) for s in steps],
        "flat_rows_frac": statistics.mean(flat) if flat else None,
        "wall_s": round(time.time() - start, 1),
    }
    for b in BUCKETS:
        curve = [v for _, _, v in evals[b]]
        run[b] = curve
        run[f"final_{b}"] = statistics.mean(curve[-3:])
        run[f"auc_{b}"] = area(steps, curve)
        run[f"slip_{b}"] = max(curve) - statistics.mean(curve[-3:])
    return run


def area(steps: list[int], curve: list[float]) -> float:
    """Area under the held-out accuracy curve over the run's steps (trapezoids), as a mean accuracy."""
    total = sum((b - a) * (x + y) / 2 for a, b, x, y in zip(steps, steps[1:], curve, curve[1:], strict=False))
    return total / max(steps[-1] - steps[0], 1)


def reach(run: dict, target: float, bucket: str = "easy") -> float | None:
    """Training seconds at the first evaluation at or above `target` (None: never)."""
    return next((s for s, a in zip(run["seconds"], run[bucket], strict=True) if a >= target), None)


def _per_seed(values, fmt: str) -> str:
    return " / ".join(v if isinstance(v, str) else format(v, fmt) for v in values)


def table(results: dict, seeds: list[int]) -> str:
    """Per bucket: final, gain, AUC, slip, seconds and tokens to the plain arm's final (x plain's
    run); then flat rows, run seconds and tokens per arm."""
    out = []
    for b in BUCKETS:
        out += [f"**{b}**", "", "| arm | final (per seed) | gain | AUC | slip (max) | "
                "s to plain's final (x plain's s) | tokens to it (x plain's) |", "|---|---|---|---|---|---|---|"]
        for arm, runs in results.items():
            ratios, token_ratios = [], []
            for s in seeds:
                plain = results.get("plain", {}).get(s)
                if plain is None:
                    continue
                at = reach(runs[s], plain[f"final_{b}"], b)
                if at is None or plain[f"final_{b}"] <= runs[s][b][0]:  # never, or plain never rose above the start
                    ratios.append("never" if at is None else "n/a")
                    token_ratios.append(ratios[-1])
                else:
                    i = runs[s]["seconds"].index(at)
                    ratios.append(at / plain["seconds"][-1])
                    token_ratios.append(runs[s]["tokens"][i] / max(plain["tokens"][-1], 1))
            out.append(
                f"| {arm} | {_per_seed([runs[s][f'final_{b}'] for s in seeds], '.3f')} | "
                f"{_per_seed([runs[s][f'final_{b}'] - runs[s][b][0] for s in seeds], '+.3f')} | "
                f"{_per_seed([runs[s][f'auc_{b}'] for s in seeds], '.3f')} | "
                f"{max(runs[s][f'slip_{b}'] for s in seeds):.3f} | {_per_seed(ratios, '.2f')} | "
                f"{_per_seed(token_ratios, '.2f')} |")
        out.append("")
    out += ["| arm | flat_rows_frac | run s | rollout tokens (M) |", "|---|---|---|---|"]
    for arm, runs in results.items():
        flats = [runs[s]["flat_rows_frac"] for s in seeds if runs[s]["flat_rows_frac"] is not None]
        seconds = _per_seed([runs[s]["seconds"][-1] for s in seeds], ".0f")
        out.append(f"| {arm} | {_per_seed(flats, '.2f')} | {seconds} | "
                   f"{_per_seed([runs[s]['tokens'][-1] / 1e6 for s in seeds], '.2f')} |")
    return "\n".join(out)


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
