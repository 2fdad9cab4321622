"""Exact-answer reward: 1.0 when the extracted final answer equals the reference numerically."""

from __future__ import annotations

from grpo_aug.data.records import Prompt
from grpo_aug.rewards.extract import extract_answer, to_number


class MathReward:
    """correct/incorrect reward; `correct` and `wrong` are the two scores (default 1 / 0)."""

    name = "math"

    def __init__(self, correct: float = 1.0, wrong: float = 0.0) -> None:
        self.correct = float(correct)
        self.wrong = float(wrong)

    def __call__(self, prompt: Prompt, completion: str) -> float:
        reference = to_number(prompt.answer)
        if reference is None:
            raise ValueError(f"prompt {prompt.id!r} has a non-numeric reference answer {prompt.answer!r}")
        predicted = to_number(extract_answer(completion))
        return self.correct if predicted == reference else self.wrong
