"""Find and normalise the final answer in a completion. Text is parsed, never evaluated."""

from __future__ import annotations

import re
from fractions import Fraction

from grpo_aug.mathtext import ANSWER_NUMBER, normalize_number, number_or_none

_NUM = ANSWER_NUMBER
# Most explicit marker first; within one marker the last occurrence wins (models restate).
_PATTERNS = [
    re.compile(r"####\s*(" + _NUM + ")"),
    re.compile(r"\\boxed\{\s*(" + _NUM + r")\s*\}"),
    re.compile(r"[Tt]he (?:final )?answer is[:\s]*(" + _NUM + ")"),
    re.compile(r"(?:^|\n)\s*A:\s*(" + _NUM + ")"),
]
_ANY_NUMBER = re.compile(_NUM)


def extract_answer(text: str) -> str | None:
    """The final answer of a completion as a normalised number string, or None if none found.

    Order: '#### N', '\\boxed{N}', 'The answer is N', an 'A: N' line, else the last number.
    """
    for pattern in _PATTERNS:
        found = pattern.findall(text)
        if found:
            return normalize_number(found[-1])
    numbers = _ANY_NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def to_number(answer: str | None) -> Fraction | None:
    """Exact numeric value of a normalised answer (so '0.5' == '1/2'), None if unparseable."""
    return None if answer is None else number_or_none(answer)
