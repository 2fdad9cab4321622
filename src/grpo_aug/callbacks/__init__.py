"""Callbacks that observe each step's report (report.StepReport): sample-health metrics, alerts,
sample tables for the trackers; and the adaptive temperature controller, which moves the rollout
stage's ladder through GroupRollout.set_temperatures; and the rank watch, which turns a rank
that died or froze into a named, bounded stop. None of them is needed for training."""

from grpo_aug.callbacks.alerts import AlertFailure, Alerts
from grpo_aug.callbacks.health import SampleHealth, health_values
from grpo_aug.callbacks.temperature import AdaptiveTemperature

__all__ = ["AlertFailure", "Alerts", "AdaptiveTemperature", "SampleHealth", "health_values"]
