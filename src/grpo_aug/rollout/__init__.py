"""Batched group rollout: one decode loop for all B x G rows, per-row temperature and top-p."""

from grpo_aug.rollout.sampling import generate, sample_next_token
from grpo_aug.rollout.types import Rollout

__all__ = ["Rollout", "generate", "sample_next_token"]
