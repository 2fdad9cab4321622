"""Reward functions: plain callables (prompt record, completion text) -> float | None, and functions
written for TRL's GRPOTrainer (TRLReward), called once per batch."""

from grpo_aug.answers import AnswerFormat
from grpo_aug.rewards.combine import RewardFunction, RewardSet, Scores
from grpo_aug.rewards.math import MathReward
from grpo_aug.rewards.model import ModelReward
from grpo_aug.rewards.soft_math import SoftMathReward
from grpo_aug.rewards.text import FormatReward, RepetitionReward, ScriptReward, SimilarityReward, ThinkAnswerFormat
from grpo_aug.rewards.trl import TRLReward

__all__ = [
    "AnswerFormat", "FormatReward", "MathReward", "ModelReward", "RepetitionReward", "RewardFunction",
    "RewardSet", "Scores", "ScriptReward", "SimilarityReward", "SoftMathReward", "TRLReward", "ThinkAnswerFormat",
]
