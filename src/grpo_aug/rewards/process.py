"""Calculations written inside a solution: `<<48/2=24>>` annotations and plain `48/2 = 24`.

The text may come from the policy, so every scan is bounded: numbers in a plain calculation have
at most 20 digits (plus separators and decimals), a plain chain at most 8 operators, a text at
most MAX_CALCULATIONS calculations (the first ones in reading order; a worked solution has ~10),
each distinct expression is evaluated once, and the order check is linear in the steps.
"""

from __future__ import annotations

import re
from fractions import Fraction
from itertools import islice
from typing import NamedTuple

from grpo_aug.mathtext import ANNOTATION, WRITTEN_NUMBER, NotArithmetic, evaluate, matches, number_or_none

MAX_CALCULATIONS = 256
# bounded quantifiers keep the plain-calculation search linear on runs like "1,1,1,..." or "1 + 1 + ..."
_NUMBER = r"\d{1,20}+(?:,\d{3}){0,6}+(?:\.\d{1,12}+)?+%?+"
# a plain calculation needs an operator between two numbers: "7 = 7" or "step 2 = 9" is not one;
# it starts where no number does (not after a word character, '.' or ','). Each operator-and-
# operand is an atomic group and the chain is possessive, so a long "1 + 1 + ..." without '=' fails
# at once instead of backtracking through every way to split its spaces.
_PLAIN = re.compile(
    r"(?<![\w.,])(\(?\s{0,3}" + _NUMBER + r"(?>\s{0,3}\)?\s{0,3}[-+*/x×÷]\s{0,3}\(?\s{0,3}" + _NUMBER
    + r"\s{0,3}\)?){1,8}+)\s{0,3}=\s{0,3}(-?" + _NUMBER + r")(?!\d)"
)


class Calculation(NamedTuple):
    expression: str
    claimed: str
    correct: bool | None  # None: the expression could not be evaluated (not counted either way)
    value: Fraction | None  # the claimed result as a number


def calculations(text: str) -> list[Calculation]:
    """The first MAX_CALCULATIONS calculations in `text` in reading order; plain ones are
    searched outside annotations."""
    found = [(m.start(), m.group(1), m.group(2)) for m in islice(ANNOTATION.finditer(text), MAX_CALCULATIONS)]
    outside = ANNOTATION.sub(lambda m: " " * len(m.group(0)), text)  # blanked, so positions hold
    found += [(m.start(), m.group(1), m.group(2)) for m in islice(_PLAIN.finditer(outside), MAX_CALCULATIONS)]
    found.sort(key=lambda item: item[0])
    checked: dict[tuple[str, str], Calculation] = {}  # a collapsing policy repeats one step thousands of times
    out = []
    for _, expression, claimed in found[:MAX_CALCULATIONS]:
        key = (expression, claimed)
        if key not in checked:
            checked[key] = _check(expression, claimed)
        out.append(checked[key])
    return out


def _check(expression: str, claimed: str) -> Calculation:
    claimed = claimed.strip()
    value = number_or_none(claimed.replace(",", "").replace("$", "").rstrip("%"))
    try:
        correct = matches(evaluate(expression), claimed.rstrip("%"))
    except NotArithmetic:
        correct = None
    return Calculation(expression.strip(), claimed, correct, value)


def step_results(solution: str) -> list[Fraction]:
    """The results of a reference solution's calculator steps, in order."""
    return [c.value for c in calculations(solution) if c.value is not None]


_OPERAND = re.compile(WRITTEN_NUMBER)


def _numbers(text: str) -> set[Fraction]:
    values = (number_or_none(n.replace(",", "")) for n in _OPERAND.findall(text))
    return {v for v in values if v is not None}


def uses_every_number(steps: list[Calculation], question: str) -> bool:
    """True when every number the question gives is an operand of some step (a working that stops
    before the question's last number has not)."""
    used = set().union(*(_numbers(step.expression) for step in steps))
    return _numbers(question) <= used


def in_order(steps: list[Calculation], question: str) -> bool:
    """False when a step uses a value that only a later step computes (and the question lacks)."""
    given = _numbers(question)
    first, last = {}, {}  # value -> the first and last step that computes it
    for i, step in enumerate(steps):
        if step.value is not None:
            first.setdefault(step.value, i)
            last[step.value] = i
    for i, step in enumerate(steps):
        # computed by a later step and by no earlier one
        if any(v in first and first[v] >= i and last[v] > i and v not in given for v in _numbers(step.expression)):
            return False
    return True
