"""Calculations written inside a solution: `<<48/2=24>>` annotations and plain `48/2 = 24`."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import NamedTuple

from grpo_aug.arith import NotArithmetic, evaluate, matches

_NUMBER = r"\d[\d,]*(?:\.\d+)?%?"
_ANNOTATION = re.compile(r"<<([^<>=]{1,200})=([^<>=]{1,40})>>")
# a plain calculation needs an operator between two numbers: "7 = 7" or "step 2 = 9" is not one
_PLAIN = re.compile(
    r"(?<![\w.])(\(?\s*" + _NUMBER + r"(?:\s*\)?\s*[-+*/x×÷]\s*\(?\s*" + _NUMBER + r"\s*\)?)+)\s*=\s*(-?"
    + _NUMBER + r")"
)


class Calculation(NamedTuple):
    expression: str
    claimed: str
    correct: bool | None  # None: the expression could not be evaluated (not counted either way)
    value: Fraction | None  # the claimed result as a number


def calculations(text: str) -> list[Calculation]:
    """Every calculation in `text`, annotations first; plain ones are searched outside annotations."""
    found = [_check(e, c) for e, c in _ANNOTATION.findall(text)]
    outside = _ANNOTATION.sub(" ", text)
    found += [_check(e, c) for e, c in _PLAIN.findall(outside)]
    return found


def _check(expression: str, claimed: str) -> Calculation:
    claimed = claimed.strip()
    try:
        value = Fraction(claimed.replace(",", "").replace("$", "").rstrip("%"))
    except (ValueError, ZeroDivisionError):
        value = None
    try:
        correct = matches(evaluate(expression), claimed.rstrip("%"))
    except NotArithmetic:
        correct = None
    return Calculation(expression.strip(), claimed, correct, value)


def step_results(solution: str) -> list[Fraction]:
    """The results of a reference solution's calculator steps, in order."""
    return [c.value for c in calculations(solution) if c.value is not None]
