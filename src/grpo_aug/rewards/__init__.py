"""Reward functions: plain callables (prompt record, completion text) -> float."""

from grpo_aug.rewards.extract import extract_answer, to_number
from grpo_aug.rewards.math import MathReward
from grpo_aug.rewards.combine import RewardFunction, score_completions

__all__ = ["MathReward", "RewardFunction", "extract_answer", "score_completions", "to_number"]
