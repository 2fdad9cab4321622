"""Callbacks that turn rollout stats into sample-health metrics."""

from grpo_aug.callbacks.health import SampleHealth, health_values

__all__ = ["SampleHealth", "health_values"]
