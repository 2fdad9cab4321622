"""Find and normalise the final answer in a completion. Text is parsed, never evaluated."""

from __future__ import annotations

import re
from fractions import Fraction

_NUM = r"-?\$?\s?\d[\d,]*(?:\.\d+)?(?:\s?/\s?\d+)?%?"
# Most explicit marker first; within one marker the last occurrence wins (models restate).
_PATTERNS = [
    re.compile(r"####\s*(" + _NUM + ")"),
    re.compile(r"\\boxed\{\s*(" + _NUM + r")\s*\}"),
    re.compile(r"[Tt]he (?:final )?answer is[:\s]*(" + _NUM + ")"),
    re.compile(r"(?:^|\n)\s*A:\s*(" + _NUM + ")"),
]
_ANY_NUMBER = re.compile(_NUM)
_MAX_DIGITS = 64  # longer "numbers" are junk; Fraction on them would be slow for nothing


def normalize_number(raw: str) -> str | None:
    """'$1,234.00' -> '1234', '50%' -> '50', ' 3 / 4' -> '3/4', '-0.50' -> '-0.5'."""
    s = raw.replace(",", "").replace("$", "").replace("%", "").replace(" ", "")
    if not s or len(s) > _MAX_DIGITS:
        return None
    try:
        value = Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    if value.denominator == 1:
        return str(value.numerator)
    if "/" in s:
        return f"{value.numerator}/{value.denominator}"
    return s.rstrip("0").rstrip(".") if "." in s else s


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
    if answer is None:
        return None
    try:
        return Fraction(answer)
    except (ValueError, ZeroDivisionError):
        return None
