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


class SampleHealth(L.Callback):
    """Logs the health metrics every `every_n_steps` optimizer steps (weighted means in between)."""

    def __init__(self, every_n_steps: int = 100) -> None:
        if every_n_steps < 1:
            raise ValueError(f"callbacks.health.every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        # created on first sight (one per name health_values returns, rungs included); every rank
        # sees the same names, so compute() syncs them in the same order everywhere
        self.metrics: dict[str, MeanMetric] = {}
        self.updated: set[str] = set()  # since the last log point; a removed rung drops out
        self.logged_window = 0  # global_step // every_n_steps at the last log point

    def on_train_start(self, trainer, pl_module) -> None:
        self.logged_window = trainer.global_step // self.every_n_steps  # a resumed run continues its windows

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        for name, (value, weight) in health_values(outputs).items():
            if name not in self.metrics:
                self.metrics[name] = MeanMetric().to(pl_module.device)
            self.metrics[name].update(value.detach(), weight)
            self.updated.add(name)
        # one batch can make several optimizer steps, so a window is closed when crossed, not hit
        window = trainer.global_step // self.every_n_steps
        if window > self.logged_window:
            self.logged_window = window
            # compute() all-reduces across ranks, so every rank must reach this line
            values = {name: self.metrics[name].compute().item() for name in sorted(self.updated)}
            for name in self.updated:
                self.metrics[name].reset()
            self.updated.clear()
            for logger in trainer.loggers:
                logger.log_metrics(values, step=trainer.global_step)
