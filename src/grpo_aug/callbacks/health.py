"""Sample-health metrics, accumulated with torchmetrics (synced across ranks) between log points.

health/reward_mean                mean reward of the scored completions (unscorable rows are not a 0)
health/reward_std                 mean over groups of the within-group reward std (< 0.3: little contrast),
                                  over the rows that count in their group, as the advantages see them
health/group_std_low_frac         groups whose reward std is below `low_std` (0.3): little signal
health/group_std_high_frac        groups whose reward std is above `high_std` (2.0): outliers dominate
health/zero_std_frac              groups whose counted rewards are all equal: no signal at all
health/effective_token_ratio      tokens that carry loss / generated tokens (masks remove junk)
health/kl_mean, health/kl_max     KL to the reference per loss token: mean, and the largest token
health/entropy_mean               policy entropy per loss token (collapse toward 0: no exploration left)
health/adv_abs_mean               mean |advantage| of the rows in the update
health/clip_frac[_low|_high]      share of loss tokens whose ratio was clipped
health/truncation_rate            completions that hit max_new_tokens without EOS
health/completion_length_mean, _p10, _p50, _p90
health/length_polarisation        p90 / p10 of completion lengths: >> 1 means some completions stop
                                  at once while others run long (two populations, not one spread)
rollout/unique_ratio              completions that are not near-copies of another in their group
rollout/groups_dropped_frac       groups left out of the update: too few distinct completions, or no spread
                                  under rollout.filter.zero_std
rollout/refill_rounds             extra rollout rounds the zero-std refill needed
rollout/refill_exhausted          steps that ended their refill rounds short of data.batch_size groups
rollout/zero_std_frac             the same as health/zero_std_frac (the rollout view of it)
rollout/reward_by_temperature/T   mean reward of the rows sampled at temperature T
health/reward_mean/<bucket>       mean reward per difficulty bucket, at its own (longer) interval
Token-weighted metrics (kl, entropy, clip fractions) and |advantage| write no point for a window
without loss tokens (e.g. every group filtered out as flat): there is nothing to average.
TensorBoard also gets histograms of rewards, advantages and lengths, and text samples per bucket.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torchmetrics import CatMetric, MaxMetric, MeanMetric

from grpo_aug.algo.group_stats import counted_mean, group_stats, length_quantiles, polarisation
from grpo_aug.report import StepReport
from grpo_aug.resume import gather_per_rank, own_entry


def health_values(report: StepReport, low_std: float = 0.3, high_std: float = 2.0) -> dict[str, tuple]:
    """(value, weight) per mean metric for one step's report.

    Rewards are averaged over scored rows, group statistics over the rows that count in their
    group (`group_stats`): the same rows and the same std as the advantages. A weight of 0 (no
    scored row, no group with a std, no loss token) means the step adds nothing to that metric.
    """
    rewards = report.rewards  # [N, G]
    scored = report.scored  # [N, G]
    lengths = report.lengths.float()  # [N*G]
    generated = lengths.sum()
    one = torch.ones((), device=rewards.device)
    rows = one * rewards.numel()
    stats = group_stats(rewards, report.counted)
    has = stats.has_std  # [N]
    with_std = one * has.sum()
    stds = stats.std[has]  # [n]

    def share(flags: torch.Tensor) -> torch.Tensor:
        return flags.float().mean() if flags.numel() else 0 * one

    zero_std = share(~stats.informative[has])
    advantages = report.advantages.float()
    loss_tokens = report.loss_tokens.float()
    values = {
        "health/reward_mean": (counted_mean(rewards, scored), one * scored.sum()),
        "health/reward_std": (stds.mean() if stds.numel() else 0 * one, with_std),
        "health/group_std_low_frac": (share(stds < low_std), with_std),
        "health/group_std_high_frac": (share(stds > high_std), with_std),
        "health/zero_std_frac": (zero_std, with_std),
        "health/effective_token_ratio": (loss_tokens / generated.clamp(min=1), generated),
        "health/kl_mean": (report.kl_mean, loss_tokens),
        "health/entropy_mean": (report.entropy_mean, loss_tokens),
        "health/adv_abs_mean": (advantages.abs().mean() if advantages.numel() else 0 * one, one * advantages.numel()),
        "health/truncation_rate": (report.truncated.float().mean(), rows),
        "health/completion_length_mean": (lengths.mean(), rows),
        "rollout/unique_ratio": (report.distinct.float().mean(), rows),
        "rollout/groups_dropped_frac": ((~report.valid.any(dim=1)).float().mean(), one * rewards.shape[0]),
        "rollout/zero_std_frac": (zero_std, with_std),
    }
    for name in ("clip_frac", "clip_frac_low", "clip_frac_high"):
        values[f"health/{name}"] = (getattr(report, name), loss_tokens)
    for name in ("refill_rounds", "refill_exhausted"):
        values[f"rollout/{name}"] = (getattr(report, name), one)
    temperatures = report.temperatures.reshape(rewards.shape)  # [N, G]
    for t in temperatures[0].unique().tolist():  # every group uses the same ladder
        rung = (temperatures == t) & scored
        values[f"rollout/reward_by_temperature/{t:g}"] = (counted_mean(rewards, rung), one * rung.sum())
    device = rewards.device
    return {k: (torch.as_tensor(v, dtype=torch.float32, device=device), torch.as_tensor(w, device=device))
            for k, (v, w) in values.items()}


def length_stats(lengths: torch.Tensor) -> dict[str, float]:
    """Quantiles (linear interpolation) and the polarisation index p90 / p10 of completion lengths."""
    p10, p50, p90 = length_quantiles(lengths)
    return {"health/completion_length_p10": p10, "health/completion_length_p50": p50,
            "health/completion_length_p90": p90, "health/length_polarisation": polarisation(p10, p90)}


class WindowedMeans:
    """Weighted means per name, flushed when the optimizer step crosses a multiple of `every`.

    Metrics are created on first sight; every rank sees the same names in the same steps (same
    ladder, same bucket), so compute() all-reduces them in the same order everywhere.
    """

    def __init__(self, every: int) -> None:
        self.every = every
        self.metrics: dict[str, MeanMetric] = {}
        self.updated: set[str] = set()  # since the last flush; a name not updated is not logged
        self.window = 0  # global_step // every at the last flush

    def update(self, values: Mapping[str, tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> None:
        """Every name is updated on every rank, with weight 0 when the step has nothing for it
        (its value then does not matter and is made finite): compute() must see the same names
        everywhere, and a window whose weights are all 0 writes no point."""
        for name, (value, weight) in values.items():
            if name not in self.metrics:
                self.metrics[name] = MeanMetric().to(device)
            weight = torch.as_tensor(weight, dtype=torch.float32, device=value.device)
            value = torch.where(weight > 0, value.detach(), torch.zeros_like(value))
            self.metrics[name].update(value, weight)
            self.updated.add(name)

    def due(self, global_step: int) -> bool:
        """True once per window (one batch may span several optimizer steps)."""
        window = global_step // self.every
        if window <= self.window:
            return False
        self.window = window
        return True

    def state_dict(self) -> dict:
        """The open window: per name its weighted sum and weight (this rank's, unsynced)."""
        sums = {name: (m.mean_value.item(), m.weight.item()) for name, m in self.metrics.items()}
        return {"sums": sums, "updated": sorted(self.updated), "window": self.window}

    def load_state_dict(self, state: dict, device: torch.device) -> None:
        for name, (total, weight) in state["sums"].items():
            self.metrics[name] = MeanMetric().to(device)
            value = total / weight if weight > 0 else 0.0  # one update that leaves the same sum and weight
            self.metrics[name].update(torch.tensor(value, device=device), torch.tensor(weight, device=device))
        self.updated = set(state["updated"])
        self.window = state["window"]

    def compute(self) -> dict[str, float]:
        """Window means; a name whose window had no weight (0 / 0) is left out."""
        values = {name: self.metrics[name].compute().item() for name in sorted(self.updated)}
        for name in self.updated:
            self.metrics[name].reset()
        self.updated.clear()
        return {name: v for name, v in values.items() if math.isfinite(v)}


class SampleHealth(L.Callback):
    """Logs the health metrics every `every_n_steps` optimizer steps, and the mean reward per
    difficulty bucket every `bucket_every_n_steps` (a bucket's curve is sparse: a step draws one
    bucket). With a TensorBoard logger it also writes histograms and `samples_per_bucket` text rows."""

    def __init__(self, every_n_steps: int = 100, bucket_every_n_steps: int = 500, low_std: float = 0.3,
                 high_std: float = 2.0, samples_per_bucket: int = 4) -> None:
        for key, value in (("every_n_steps", every_n_steps), ("bucket_every_n_steps", bucket_every_n_steps)):
            if value < 1:
                raise ValueError(f"callbacks.health.{key} must be >= 1, got {value}")
        if not 0 <= low_std < high_std:
            raise ValueError(f"callbacks.health needs 0 <= low_std < high_std, got {low_std}, {high_std}")
        self.every_n_steps = every_n_steps
        self.bucket_every_n_steps = bucket_every_n_steps
        self.low_std, self.high_std = low_std, high_std
        self.samples_per_bucket = samples_per_bucket
        self.overall = WindowedMeans(every_n_steps)
        self.by_bucket = WindowedMeans(bucket_every_n_steps)
        self.kl_max = MaxMetric()
        self.distributions = {name: CatMetric() for name in ("rewards", "advantages", "lengths")}
        self.samples: dict[str, list[dict]] = {}  # bucket -> the latest text rows
        self.last: dict[str, float] = {}  # the latest logged values, for the final hparams
        self._restored: dict | None = None  # this rank's windows from a checkpoint, applied at train start

    def on_train_start(self, trainer, pl_module) -> None:
        for means in (self.overall, self.by_bucket):  # a resumed run continues its windows
            means.window = trainer.global_step // means.every
        self.kl_max.to(pl_module.device)
        for metric in self.distributions.values():
            metric.to(pl_module.device)
        if self._restored is not None:
            self._restore(self._restored, pl_module.device)
            self._restored = None

    # -- checkpoints: the open windows, so a resumed run logs the points an uninterrupted one does
    def state_dict(self) -> dict:
        kl_max = self.kl_max.max_value.item() if self.kl_max.update_count else None
        dists = {}
        for name, metric in self.distributions.items():
            values = metric.value if isinstance(metric.value, list) else [metric.value]
            dists[name] = torch.cat([v.reshape(-1) for v in values]).cpu() if values else torch.zeros(0)
        mine = {"overall": self.overall.state_dict(), "by_bucket": self.by_bucket.state_dict(), "kl_max": kl_max,
                "distributions": dists}
        return {"per_rank": gather_per_rank(mine), "samples": self.samples, "last": self.last}

    def load_state_dict(self, state: dict) -> None:
        self.samples, self.last = dict(state["samples"]), dict(state["last"])
        self._restored = own_entry(state["per_rank"], "health windows")

    def _restore(self, mine: dict, device) -> None:
        self.overall.load_state_dict(mine["overall"], device)
        self.by_bucket.load_state_dict(mine["by_bucket"], device)
        if mine["kl_max"] is not None:
            self.kl_max.update(torch.tensor(mine["kl_max"], device=device))
        for name, values in mine["distributions"].items():
            if values.numel():
                self.distributions[name].update(values.to(device))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        report: StepReport = outputs["report"]
        self.overall.update(health_values(report, self.low_std, self.high_std), pl_module.device)
        rewards, scored = report.rewards, report.scored  # [N, G] one bucket per step
        self.by_bucket.update({f"health/reward_mean/{report.bucket}": (
            counted_mean(rewards, scored).float(), scored.sum().float())}, pl_module.device)
        self.kl_max.update(report.kl_max.detach())
        self.distributions["rewards"].update(rewards.detach()[scored].float())
        self.distributions["advantages"].update(report.advantages.detach().float())
        self.distributions["lengths"].update(report.lengths.detach().float())
        for row in report.samples:
            self.samples.setdefault(row["bucket"], [])
            self.samples[row["bucket"]] = (self.samples[row["bucket"]] + [row])[-self.samples_per_bucket :]

        # compute() all-reduces across ranks, so every rank must reach these lines
        values: dict[str, float] = {}
        if self.overall.due(trainer.global_step):
            values.update(self.overall.compute())
            kl_max = self.kl_max.compute().item()  # every rank computes: it syncs
            self.kl_max.reset()
            if "health/kl_mean" in values:  # the window had loss tokens
                values["health/kl_max"] = kl_max
            dists = {}
            for name, metric in self.distributions.items():
                gathered = metric.compute()  # an empty list when nothing was added anywhere
                dists[name] = gathered if isinstance(gathered, torch.Tensor) else torch.zeros(0)
                metric.reset()
            if dists["lengths"].numel():
                values.update(length_stats(dists["lengths"]))
            self._write_tensorboard(trainer, dists)
        if self.by_bucket.due(trainer.global_step):
            values.update(self.by_bucket.compute())
        if values:
            self.last.update(values)
            for logger in trainer.loggers:
                logger.log_metrics(values, step=trainer.global_step)

    def _write_tensorboard(self, trainer, dists: Mapping[str, torch.Tensor]) -> None:
        for logger in trainer.loggers:
            if not isinstance(logger, TensorBoardLogger) or not trainer.is_global_zero:
                continue
            for name, values in dists.items():
                if values.numel():
                    logger.experiment.add_histogram(f"distributions/{name}", values.float().cpu(), trainer.global_step)
            for bucket, rows in sorted(self.samples.items()):
                logger.experiment.add_text(f"samples/{bucket}", samples_markdown(rows), trainer.global_step)


def _cell(text: str, limit: int = 300) -> str:
    text = text if len(text) <= limit else text[:limit] + "..."
    return text.replace("|", "\\|").replace("\n", "<br>")


def samples_markdown(rows: list[dict]) -> str:
    lines = ["| prompt | completion | T | reward | advantage |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {_cell(r['prompt'])} | {_cell(r['completion'])} | {r['temperature']:g} | "
                     f"{r['reward']:.3f} | {r['advantage']:+.3f} |")
    return "\n".join(lines)
