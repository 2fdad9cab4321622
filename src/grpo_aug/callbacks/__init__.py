"""Callbacks that turn rollout stats into sample-health metrics."""

from grpo_aug.callbacks.alerts import AlertFailure, Alerts
from grpo_aug.callbacks.health import SampleHealth, health_values
from grpo_aug.callbacks.temperature import AdaptiveTemperature

__all__ = ["AlertFailure", "Alerts", "AdaptiveTemperature", "SampleHealth", "health_values"]
