"""The mission's four sample-health metrics, accumulated with torchmetrics between log points.

health/reward_mean               mean reward of all completions
health/reward_std                mean over groups of the within-group reward std (< 0.3: little contrast)
health/effective_token_ratio     tokens that carry loss / generated tokens (masks remove junk)
health/kl_mean                   mean k3 KL to the reference per loss token (spike: policy runs away)
health/completion_length_mean    generated tokens per completion, EOS included
rollout/unique_ratio             completions that are not near-copies of another in their group
rollout/groups_dropped_frac      groups left out of the update: too few distinct completions, or no spread
                                 under rollout.filter.zero_std
rollout/refill_rounds            extra rollout rounds the zero-std refill needed
rollout/refill_exhausted         steps that ended their refill rounds short of data.batch_size groups
rollout/zero_std_frac            groups whose rewards are all equal (no signal at all)
rollout/reward_by_temperature/T  mean reward of the rows sampled at temperature T
"""

from __future__ import annotations

from collections.abc import Mapping

import lightning as L
import torch
from torchmetrics import MeanMetric


def health_values(outputs: Mapping[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(value, weight) per metric for one step's training_step outputs."""
    rewards = outputs["rewards"]  # [B, G]
    lengths = outputs["lengths"].float()  # [B*G]
    generated = lengths.sum()
    one = torch.ones((), device=rewards.device)
    values = {
        "health/reward_mean": (rewards.mean(), one * rewards.numel()),
        "health/reward_std": (rewards.std(dim=1).mean(), one * rewards.shape[0]),
        "health/effective_token_ratio": (outputs["loss_tokens"].float() / generated.clamp(min=1), generated),
        "health/kl_mean": (outputs["kl_mean"], one),
        "health/completion_length_mean": (lengths.mean(), one * lengths.numel()),
        "rollout/unique_ratio": (outputs["distinct"].float().mean(), one * rewards.numel()),
        "rollout/groups_dropped_frac": ((~outputs["valid"].any(dim=1)).float().mean(), one * rewards.shape[0]),
        "rollout/zero_std_frac": ((rewards.max(dim=1).values == rewards.min(dim=1).values).float().mean(),
                                  one * rewards.shape[0]),
    }
    for name in ("refill_rounds", "refill_exhausted"):
        values[f"rollout/{name}"] = (outputs[name], one)
    temperatures = outputs["temperatures"].reshape(rewards.shape)  # [B, G]
    for t in temperatures[0].unique().tolist():  # every group uses the same ladder
        rung = temperatures == t
        values[f"rollout/reward_by_temperature/{t:g}"] = (rewards[rung].mean(), one * rung.sum())
    return values


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
        for name, (value, weight) in values.items():
            if name not in self.metrics:
                self.metrics[name] = MeanMetric().to(device)
            self.metrics[name].update(value.detach(), weight)
            self.updated.add(name)

    def flush(self, global_step: int) -> dict[str, float]:
        """The means since the last flush if a window closed (one batch may span several steps)."""
        window = global_step // self.every
        if window <= self.window:
            return {}
        self.window = window
        values = {name: self.metrics[name].compute().item() for name in sorted(self.updated)}
        for name in self.updated:
            self.metrics[name].reset()
        self.updated.clear()
        return values


class SampleHealth(L.Callback):
    """Logs the health metrics every `every_n_steps` optimizer steps (weighted means in between),
    and the mean reward per difficulty bucket, `health/reward_mean/<bucket>`, every
    `bucket_every_n_steps` (a bucket's curve is sparse: a step draws one bucket)."""

    def __init__(self, every_n_steps: int = 100, bucket_every_n_steps: int = 500) -> None:
        for key, value in (("every_n_steps", every_n_steps), ("bucket_every_n_steps", bucket_every_n_steps)):
            if value < 1:
                raise ValueError(f"callbacks.health.{key} must be >= 1, got {value}")
        self.every_n_steps = every_n_steps
        self.bucket_every_n_steps = bucket_every_n_steps
        self.overall = WindowedMeans(every_n_steps)
        self.by_bucket = WindowedMeans(bucket_every_n_steps)

    def on_train_start(self, trainer, pl_module) -> None:
        for means in (self.overall, self.by_bucket):  # a resumed run continues its windows
            means.window = trainer.global_step // means.every

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.overall.update(health_values(outputs), pl_module.device)
        rewards = outputs["rewards"]  # [N, G] one bucket per step
        self.by_bucket.update({f"health/reward_mean/{batch[0].bucket}": (rewards.mean(), torch.tensor(
            float(rewards.numel()), device=rewards.device))}, pl_module.device)
        # compute() all-reduces across ranks, so every rank must reach these lines
        values = {**self.overall.flush(trainer.global_step), **self.by_bucket.flush(trainer.global_step)}
        if values:
            for logger in trainer.loggers:
                logger.log_metrics(values, step=trainer.global_step)
