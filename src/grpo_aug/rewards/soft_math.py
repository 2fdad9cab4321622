"""Soft rule reward for worked solutions: ranks samples by answer *and* process.

    correct  1.0  right final answer, every checkable step right, and concise:
                  len(completion) <= max_length_ratio x len(reference solution)
    flawed   0.8  right final answer, but a step evaluates wrong ("<<6*7=43>>" or "6*7 = 43"),
                  a step uses a result before the step that computes it (steps out of order),
                  or the completion is longer than the concision limit
    partial  0.3  wrong final answer, but at least one intermediate result of the reference
                  solution was computed correctly along the way (a right step whose result is a
                  reference step result other than the final answer)
                  (partial_uses_all_numbers: and every number of the question is an operand of
                  some step, so a working that stops early earns nothing: "33 - 2 = 31" for
                  "33 - 2 + 7" reaches 31 but never uses 7. For tasks whose every given number is
                  used, like the synthetic arithmetic; GSM8K's questions hold numbers no step needs)
    wrong    0.0  otherwise

Example, reference "<<47+38=85>>85\n<<85-9=76>>76\n#### 76":
    "<<47+38=85>>85\n<<85-9=76>>76\n#### 76"   -> 1.0
    "<<47+38=84>>85\n<<85-9=76>>76\n#### 76"   -> 0.8   (47+38 is not 84)
    "<<85-9=76>>76\n<<47+38=85>>85\n#### 76"   -> 0.8   (85 is used before it is computed)
    "<<47+38=85>>85\n<<85-9=75>>75\n#### 75"   -> 0.3   (85 was reached correctly)
    "<<47+38=84>>84\n<<84-9=75>>75\n#### 75"   -> 0.0
"""

from __future__ import annotations

from grpo_aug.answers import AUTO, AnswerFormat, normalize, value
from grpo_aug.data.records import Prompt
from grpo_aug.errors import UsageError
from grpo_aug.rewards.process import calculations, in_order, step_results, uses_every_number


class SoftMathReward:
    name = "soft_math"

    def __init__(self, correct: float = 1.0, flawed: float = 0.8, partial: float = 0.3, wrong: float = 0.0,
                 max_length_ratio: float = 2.0, partial_uses_all_numbers: bool = False,
                 answer: AnswerFormat | None = None) -> None:
        if max_length_ratio <= 0:
            raise UsageError(f"reward soft_math max_length_ratio must be > 0, got {max_length_ratio}")
        self.correct, self.flawed = float(correct), float(flawed)
        self.partial, self.wrong = float(partial), float(wrong)
        self.max_length_ratio = float(max_length_ratio)
        if not isinstance(partial_uses_all_numbers, bool):
            raise UsageError(f"reward soft_math partial_uses_all_numbers must be true or false, "
                             f"got {partial_uses_all_numbers!r}")
        self.partial_uses_all_numbers = partial_uses_all_numbers
        self.answer = answer or AUTO

    def __call__(self, prompt: Prompt, completion: str) -> float:
        reference = value(normalize(prompt.answer))
        if reference is None:  # the process tiers compare calculation results with numbers
            raise UsageError(f"prompt {prompt.id!r} has a non-numeric reference answer {prompt.answer!r}")
        steps = calculations(completion)
        if self.answer.correct(completion, prompt.answer):
            concise = len(completion) <= self.max_length_ratio * max(len(prompt.solution), 1)
            sound = all(c.correct is not False for c in steps) and in_order(steps, prompt.question)
            return self.correct if concise and sound else self.flawed
        intermediate = set(step_results(prompt.solution)) - {reference}
        if any(c.correct and c.value in intermediate for c in steps) and (
                not self.partial_uses_all_numbers or uses_every_number(steps, prompt.question)):
            return self.partial
        return self.wrong
