"""Callbacks that turn rollout stats into sample-health metrics."""

from grpo_aug.callbacks.alerts import AlertFailure, Alerts
from grpo_aug.callbacks.curriculum_monitor import CurriculumMonitor
from grpo_aug.callbacks.health import SampleHealth, health_values
from grpo_aug.callbacks.temperature import AdaptiveTemperature

__all__ = ["AlertFailure", "Alerts", "AdaptiveTemperature", "CurriculumMonitor", "SampleHealth", "health_values"]
