"""Exact-answer reward: `correct` when the stated final answer equals the reference, else `wrong`.

Where the answer is and how answers compare is the run's answer format (`answer=auto|boxed|tag`).
"""

from __future__ import annotations

from grpo_aug.answers import AUTO, AnswerFormat, normalize
from grpo_aug.data.records import Prompt
from grpo_aug.errors import UsageError


class MathReward:
    name = "math"

    def __init__(self, correct: float = 1.0, wrong: float = 0.0, answer: AnswerFormat | None = None) -> None:
        self.correct = float(correct)
        self.wrong = float(wrong)
        self.answer = answer or AUTO

    def __call__(self, prompt: Prompt, completion: str) -> float:
        if not normalize(prompt.answer):
            raise UsageError(f"prompt {prompt.id!r} has no usable reference answer {prompt.answer!r}")
        return self.correct if self.answer.correct(completion, prompt.answer) else self.wrong
