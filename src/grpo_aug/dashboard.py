"""The run's first page, one definition for both views of it: TensorBoard's CUSTOM SCALARS layout
(written into the run's event files at the start) and the health PNG (written by the run at the
end, or by `python scripts/plot_health.py <run>`).

Held-out accuracy per bucket, the four sample-health metrics of the mission (group reward mean and
std, effective-token ratio, KL mean, completion length and its polarisation) and the share of
rolled-out rows that came out flat.
"""

from __future__ import annotations

from pathlib import Path

from grpo_aug.data.records import BUCKETS
from grpo_aug.eventlog import read_scalars

# (chart title, tags): one chart each, in page order
CHARTS = [
    ("held-out greedy accuracy", [f"eval/accuracy/{b}" for b in BUCKETS]),
    ("group reward mean and within-group std", ["health/reward_mean", "health/reward_std"]),
    ("effective-token ratio (loss tokens / generated)", ["health/effective_token_ratio"]),
    ("KL to the reference, mean per token", ["health/kl_mean"]),
    ("completion length: mean, p10, p90 (apart: polarised)", ["health/completion_length_mean",
                                                                "health/completion_length_p10",
                                                                "health/completion_length_p90"]),
    ("flat rows: rolled out in groups with no reward spread", ["rollout/flat_rows_frac", "health/zero_std_frac"]),
]


def custom_scalar_layout() -> dict[str, dict[str, list]]:
    """The CHARTS as SummaryWriter.add_custom_scalars takes them: one category, a multiline chart
    each, every tag matched exactly (TensorBoard reads the tags as regular expressions)."""
    return {"grpo-aug: first page": {title: ["Multiline", [rf"^{t}$" for t in tags]] for title, tags in CHARTS}}


def plot_health(run_dir: Path, png: Path) -> Path:
    """The CHARTS as a 2 x 3 grid of PNG panels, from the run's event files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = read_scalars(run_dir)
    if not data:
        raise FileNotFoundError(f"no TensorBoard scalars under {run_dir}/tensorboard")
    fig, axes = plt.subplots(2, 3, figsize=(15, 7))
    for ax, (title, tags) in zip(axes.flat, CHARTS, strict=True):
        for tag in tags:
            points = sorted(data.get(tag, []))
            if points:
                ax.plot([s for s, _ in points], [v for _, v in points], marker=".", label=tag.split("/", 1)[1])
        ax.set(title=title, xlabel="optimizer step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)
    return png
