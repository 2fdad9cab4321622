"""Adaptive temperature ladder: the decoding knob for how strongly a group's rows contrast.

Every `window` steps the callback averages the within-group reward std. Below `low` for
`patience` windows in a row it adds a rung above the top one (top + `increment`, at most
`max_temperature`): more exploration, more contrast. Above `high`, or when the window's mean
reward swings by more than `swing` (std of the per-step means; null: off), it removes the top
rung, never taking the top below `floor`. The ladder and counters are checkpointed.
"""

from __future__ import annotations

import logging
import statistics

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from grpo_aug.algo.group_stats import counted_mean, group_stats, mean_std
from grpo_aug.errors import UsageError
from grpo_aug.report import StepReport

log = logging.getLogger(__name__)


class AdaptiveTemperature(L.Callback):
    def __init__(self, low: float = 0.3, high: float = 2.0, window: int = 20, patience: int = 2,
                 increment: float = 0.3, max_temperature: float = 1.7, floor: float = 1.0,
                 swing: float | None = None) -> None:
        where = "callbacks.adaptive_temperature"
        if not 0 <= low < high:
            raise UsageError(f"{where}: need 0 <= low < high, got low={low}, high={high}")
        if window < 1 or patience < 1:
            raise UsageError(f"{where}: window and patience must be >= 1, got {window}, {patience}")
        if increment <= 0 or floor > max_temperature:
            raise UsageError(f"{where}: need increment > 0 and floor <= max_temperature, got "
                             f"increment={increment}, floor={floor}, max_temperature={max_temperature}")
        self.low, self.high, self.window, self.patience = low, high, window, patience
        self.increment, self.max_temperature, self.floor, self.swing = increment, max_temperature, floor, swing
        self.ladder: list[float] | None = None
        self.low_windows = 0
        self.stds: list[float] = []
        self.means: list[float] = []

    # -- the decision, a pure function of what the window saw -------------------------------
    def observe(self, group_std: float, reward_mean: float) -> str | None:
        """Record one step; at the end of a window maybe change the ladder. Returns the change."""
        self.stds.append(group_std)
        self.means.append(reward_mean)
        if len(self.stds) < self.window:
            return None
        std = sum(self.stds) / len(self.stds)
        swing = statistics.pstdev(self.means)
        self.stds, self.means = [], []
        top = max(self.ladder)
        too_wild = std > self.high or (self.swing is not None and swing > self.swing)
        if too_wild and len(self.ladder) > 1 and sorted(self.ladder)[-2] >= self.floor:
            self.ladder.remove(top)
            self.low_windows = 0
            return f"group reward std {std:.3f} (swing {swing:.3f}): removed rung {top:g}"
        self.low_windows = self.low_windows + 1 if std < self.low else 0
        if self.low_windows >= self.patience and top < self.max_temperature:
            rung = round(min(top + self.increment, self.max_temperature), 4)
            self.ladder.append(rung)
            self.low_windows = 0
            return f"group reward std {std:.3f} < {self.low} for {self.patience} windows: added rung {rung:g}"
        return None

    # -- Lightning hooks ---------------------------------------------------------------------
    def check_rollout(self, rollout) -> None:
        """Called on the composed settings before any model loads."""
        if max(rollout.temperatures) > self.max_temperature:
            raise UsageError(f"callbacks.adaptive_temperature.max_temperature={self.max_temperature} is below "
                             f"the ladder's top rung {max(rollout.temperatures):g} (rollout.temperatures)")

    def on_train_start(self, trainer, pl_module) -> None:
        if self.ladder is None:  # fresh run; a resumed one brings its ladder from the checkpoint
            self.ladder = list(pl_module.rollout.temperatures)
        self._apply(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        report: StepReport = outputs["report"]
        rewards = report.rewards  # [B, G]
        # the std the advantages see; averaged over ranks so that every rank takes the same
        # decision and keeps the same ladder
        step = torch.stack([mean_std(group_stats(rewards, report.counted)),
                            counted_mean(rewards, report.scored)]).float()
        stats = trainer.strategy.reduce(step, reduce_op="mean")
        change = self.observe(stats[0].item(), stats[1].item())
        if change is not None:
            self._apply(pl_module)
            message = f"step {trainer.global_step}: {change}; ladder now {self.ladder}"
            if trainer.is_global_zero:
                log.info("adaptive temperature: %s", message)
            for logger in trainer.loggers:
                if isinstance(logger, TensorBoardLogger):
                    logger.experiment.add_text("rollout/temperature_ladder", message, trainer.global_step)
        if not self.stds:  # a window just closed
            for logger in trainer.loggers:
                logger.log_metrics({"rollout/temperature_max": max(self.ladder),
                                    "rollout/temperature_count": float(len(self.ladder))}, step=trainer.global_step)

    def _apply(self, pl_module) -> None:
        pl_module.rollout.set_temperatures(self.ladder)

    def state_dict(self) -> dict:
        return {"ladder": self.ladder, "low_windows": self.low_windows, "stds": self.stds, "means": self.means}

    def load_state_dict(self, state: dict) -> None:
        self.ladder = list(state["ladder"]) if state["ladder"] is not None else None
        self.low_windows = state["low_windows"]
        self.stds, self.means = list(state["stds"]), list(state["means"])
