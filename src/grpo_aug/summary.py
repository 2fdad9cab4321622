"""The end-of-run summary: what the run did, printed and written to `<run>/summary.json`.

Per bucket the held-out accuracy at the start (the first evaluation, the step-0 baseline unless
validate_before_training=false), at the end (the mean of the last three evaluations: one greedy
evaluation of 200 problems moves by a few points from one to the next) and the gain; the time split
(and a step's phases: grpo_aug/step_clock.py); the share of rolled-out rows that came in flat groups;
the alerts that fired; where everything is.
"""

from __future__ import annotations

import json
from pathlib import Path

from grpo_aug.progress import clock
from grpo_aug.step_clock import phase_line

FINAL_OF = 3  # evaluations averaged into the final accuracy


def accuracy_table(evaluations: list[tuple[int, dict[str, float]]]) -> dict[str, dict]:
    """{bucket: {start, final, gain, start_step, final_steps}} from (step, {eval/accuracy/<b>: v}) pairs."""
    if not evaluations:
        return {}
    first_step, first = evaluations[0]
    last = evaluations[-FINAL_OF:]
    table = {}
    for key, start in first.items():
        if not key.startswith("eval/accuracy/"):
            continue
        values = [v[key] for _, v in last if key in v]
        final = sum(values) / len(values)
        table[key.removeprefix("eval/accuracy/")] = {
            "start": start, "final": final, "gain": final - start, "start_step": first_step,
            "final_steps": [s for s, v in last if key in v]}
    return table


def build_summary(run_dir: Path, evaluations: list[tuple[int, dict[str, float]]], seconds: dict[str, float],
                  steps: int, flat_rows: float | None, alerts: dict[str, int], tensorboard: bool,
                  plot: Path | None, phase_seconds: dict[str, float] | None = None) -> dict:
    """The summary as a JSON-able dict; `seconds` holds total, warmup, grpo and evaluation;
    `phase_seconds` the training steps' totals per phase (grpo_aug/step_clock.py)."""
    accounted = seconds["warmup"] + seconds["grpo"] + seconds["evaluation"]
    run_dir = Path(run_dir)
    return {
        "run_dir": str(run_dir),
        "steps": steps,
        "accuracy": accuracy_table(evaluations),
        "evaluations": [{"step": s, **v} for s, v in evaluations],
        "seconds": {**seconds, "other": max(seconds["total"] - accounted, 0.0)},
        "phase_seconds": dict(phase_seconds or {}),
        "flat_rows_frac": flat_rows,
        "alerts": {k: v for k, v in alerts.items() if v},
        "paths": {
            "policy": str(run_dir / "policy"),
            "checkpoints": str(run_dir / "checkpoints"),
            "tensorboard": str(run_dir / "tensorboard") if tensorboard else None,
            "health_plot": str(plot) if plot is not None else None,
            "summary": str(run_dir / "summary.json"),
        },
        "tensorboard_command": f"tensorboard --logdir {run_dir / 'tensorboard'}" if tensorboard else None,
    }


def summary_text(summary: dict) -> str:
    lines = [f"run summary: {summary['steps']} GRPO steps"]
    table = summary["accuracy"]
    if table:
        any_row = next(iter(table.values()))
        final_steps = ", ".join(str(s) for s in any_row["final_steps"])
        lines.append(f"  held-out greedy accuracy   start   final    gain   (start: step {any_row['start_step']}; "
                     f"final: mean of steps {final_steps})")
        for bucket, row in table.items():
            lines.append(f"    {bucket:<24}{row['start']:>6.3f}{row['final']:>8.3f}{row['gain']:>+8.3f}")
    s = summary["seconds"]
    per_step = f", {s['grpo'] / summary['steps']:.2f} s/step" if summary["steps"] else ""
    phases = phase_line(summary.get("phase_seconds") or {}, summary["steps"])
    per_step += f" (of which {phases})" if phases else ""
    lines.append(f"  {clock(s['total'])} in all: warm-up {clock(s['warmup'])}, GRPO {clock(s['grpo'])}{per_step}, "
                 f"evaluation {clock(s['evaluation'])}, loading and saving {clock(s['other'])}")
    if summary["flat_rows_frac"] is not None:
        lines.append(f"  flat rows: {100 * summary['flat_rows_frac']:.1f}% of the rows rolled out came in groups "
                     "with no reward spread (rollout/flat_rows_frac)")
    alerts = summary["alerts"]
    lines.append("  alerts: " + (", ".join(f"{k} x{v}" for k, v in alerts.items()) if alerts else "none fired"))
    p = summary["paths"]
    lines.append(f"  policy       {p['policy']}")
    lines.append(f"  checkpoints  {p['checkpoints']}")
    if p["health_plot"]:
        lines.append(f"  health plot  {p['health_plot']}")
    lines.append(f"  summary      {p['summary']}")
    if summary["tensorboard_command"]:
        lines.append(f"  view it:     {summary['tensorboard_command']}")
    return "\n".join(lines)


def write_summary(summary: dict) -> Path:
    out = Path(summary["paths"]["summary"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    return out
