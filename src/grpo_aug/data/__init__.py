"""Prompt records, task sources, the curriculum batch sampler and the DataModule."""

from grpo_aug.data.records import Prompt

__all__ = ["Prompt"]
