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
    """Every calculation in `text` in reading order; plain ones are searched outside annotations."""
    found = [(m.start(), _check(m.group(1), m.group(2))) for m in _ANNOTATION.finditer(text)]
    outside = _ANNOTATION.sub(lambda m: " " * len(m.group(0)), text)  # blanked, so positions hold
    found += [(m.start(), _check(m.group(1), m.group(2))) for m in _PLAIN.finditer(outside)]
    return [c for _, c in sorted(found, key=lambda pair: pair[0])]


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


_OPERAND = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _numbers(text: str) -> set[Fraction]:
    return {Fraction(n.replace(",", "")) for n in _OPERAND.findall(text)}


def in_order(steps: list[Calculation], question: str) -> bool:
    """False when a step uses a value that only a later step computes (and the question lacks)."""
    given = _numbers(question)
    for i, step in enumerate(steps):
        later = {c.value for c in steps[i + 1 :] if c.value is not None}
        earlier = {c.value for c in steps[:i] if c.value is not None}
        if any(v in later and v not in earlier and v not in given for v in _numbers(step.expression)):
            return False
    return True
