"""Plot a run's health dashboard from its TensorBoard event files into one PNG.

    python scripts/plot_health.py outputs/grpo/<run> [out.png]

Reads the events with TensorBoard's own reader; no TensorBoard server needed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from grpo_aug.eventlog import read_scalars  # noqa: E402

PANELS = [
    ("held-out greedy accuracy", ["eval/accuracy/easy", "eval/accuracy/medium", "eval/accuracy/hard"]),
    ("reward", ["health/reward_mean", "health/reward_std"]),
    ("groups", ["health/zero_std_frac", "health/group_std_low_frac", "health/group_std_high_frac"]),
    ("tokens", ["health/effective_token_ratio", "health/truncation_rate"]),
    ("KL / entropy", ["health/kl_mean", "health/entropy_mean"]),
    ("completion length", ["health/completion_length_p10", "health/completion_length_p50",
                           "health/completion_length_p90"]),
]


def main(run: Path, png: Path) -> Path:
    data = read_scalars(run)
    if not data:
        raise SystemExit(f"no TensorBoard scalars under {run}/tensorboard")
    fig, axes = plt.subplots(2, 3, figsize=(15, 7))
    for ax, (title, tags) in zip(axes.flat, PANELS, strict=True):
        for tag in tags:
            points = sorted(data.get(tag, []))
            if points:
                ax.plot([s for s, _ in points], [v for _, v in points], marker=".", label=tag.split("/", 1)[1])
        ax.set(title=title, xlabel="optimizer step")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    return png


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        raise SystemExit(__doc__)
    run_dir = Path(sys.argv[1])
    print(main(run_dir, Path(sys.argv[2]) if len(sys.argv) > 2 else run_dir / "health.png"))
