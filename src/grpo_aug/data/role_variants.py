"""Variants that change what is asked, with answers recomputed by the bounded evaluator.

RoleReversal: give the result, ask for a starting quantity. The first step's left operand x is
replaced by "X" in the question (it must occur there exactly once), the original answer is
stated, and X is asked for. The reference chain is inverted step by step, from the answer back to
x, each inverse step evaluated with `grpo_aug.mathtext.evaluate` and checked to land on the
original intermediate value. It needs a chain of binary steps in which every step uses the
previous step's result exactly once and nothing else that depends on x (synthetic problems
nearly always; GSM8K when its chain is such a path). In GSM8K problems a starting value that
often stands for a word (2, 12, 60, ...) is not reversed: the number the question shows might be
another quantity. Same number of steps as the original: the difficulty does not jump.

ConstraintChange (synthetic arithmetic only): the order of two neighbouring operations is swapped,
`(47 + 38) * 3 - 12` becomes `47 * 3 + 38 - 12` (the same operations, applied in another order),
and the chain is re-evaluated; kept only when every intermediate result stays a non-negative
integer and the answer changes. A GSM8K question states its order in words, which cannot be
rewritten safely, so GSM8K records fail this kind.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace
from fractions import Fraction

from grpo_aug.data.records import Prompt
from grpo_aug.data.variants import NUMBER, WORD_VALUES, VariantFailed, format_like, number_value
from grpo_aug.mathtext import ANNOTATION, NotArithmetic, evaluate, matches

_BINARY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([-+*/])\s*(\d+(?:\.\d+)?)\s*$")
_SYNTHETIC = re.compile(r"^What is (.+)\?$")


@dataclass(frozen=True)
class Step:
    left: Fraction
    op: str
    right: Fraction
    value: Fraction
    claimed: str  # the result as the solution wrote it


def binary_chain(solution: str) -> list[Step]:
    """The solution's calculator steps, each `a op b` and checked; VariantFailed otherwise."""
    steps = []
    for expr, claimed in ANNOTATION.findall(solution):
        m = _BINARY.match(expr.replace(",", ""))
        if m is None:
            raise VariantFailed(f"step {expr!r} is not one binary operation")
        try:
            value = evaluate(expr.replace(",", ""))
        except NotArithmetic as err:
            raise VariantFailed(f"step {expr!r} does not evaluate: {err}") from None
        if not matches(value, claimed.strip()):
            raise VariantFailed(f"the original step {expr}={claimed} is wrong")
        steps.append(Step(Fraction(m.group(1)), m.group(2), Fraction(m.group(3)), value, claimed.strip()))
    if not steps:
        raise VariantFailed("the solution has no calculator steps")
    return steps


def _text(value: Fraction) -> str:
    return format_like(value, "0.00") if value.denominator != 1 else str(value.numerator)


def _inverse(y: Fraction, step: Step, carried_left: bool) -> str:
    """The expression giving the carried operand back from the step's result y."""
    other = step.right if carried_left else step.left
    y_, o = _text(y), _text(other)
    if step.op == "+":
        return f"{y_}-{o}"
    if step.op == "*":
        return f"{y_}/{o}"
    if step.op == "-":
        return f"{y_}+{o}" if carried_left else f"{o}-{y_}"
    return f"{y_}*{o}" if carried_left else f"{o}/{y_}"


class RoleReversal:
    name = "reversal"

    def __call__(self, record: Prompt, rng: random.Random) -> Prompt:
        steps = binary_chain(record.solution)
        if "/" in record.answer or steps[-1].value != number_value(record.answer):
            raise VariantFailed("the last step does not give the final answer")
        x = steps[0].left
        sides = [True]  # is the carried value the left operand of each step
        for prev, step in zip(steps, steps[1:], strict=False):
            if step.left == prev.value and step.right != prev.value:
                sides.append(True)
            elif step.right == prev.value and step.left != prev.value:
                sides.append(False)
            else:
                raise VariantFailed("the chain is not a path through the previous results")
        # the other operand of every step must be known without X: not X itself and no earlier
        # result (X + X / 2 = 72 needs algebra, not inversion)
        depends = {x}
        for step, carried_left in zip(steps, sides, strict=True):
            if (step.right if carried_left else step.left) in depends:
                raise VariantFailed("a step uses the starting quantity twice")
            depends.add(step.value)
        if x in WORD_VALUES and _SYNTHETIC.match(record.question) is None:
            # 2, 12, 60 ... may be a word in the question ("twice", "a dozen", "an hour"): the
            # number the question shows could be another quantity of the same value
            raise VariantFailed(f"the starting quantity {_text(x)} may stand for a word")
        places = [m for m in NUMBER.finditer(record.question) if number_value(m.group(0)) == x]
        if len(places) != 1:
            raise VariantFailed(f"the starting quantity {_text(x)} is not in the question exactly once")
        y, lines = steps[-1].value, []
        for step, carried_left in zip(reversed(steps), reversed(sides), strict=True):
            expr = _inverse(y, step, carried_left)
            try:
                y = evaluate(expr)
            except NotArithmetic as err:
                raise VariantFailed(f"the inverse step {expr!r} does not evaluate: {err}") from None
            if y != (step.left if carried_left else step.right):
                raise VariantFailed(f"the inverse step {expr} does not give the original operand back")
            lines.append(f"<<{expr}={_text(y)}>>{_text(y)}")
        start, end = places[0].span()
        question = (f"{record.question[:start]}X{record.question[end:]} The answer is {record.answer}. "
                    "What is X?")
        return replace(record, columns=None, question=question, prompt=record.prompt.replace(record.question, question),
                       answer=_text(x), solution="\n".join(lines) + f"\n#### {_text(x)}")


class ConstraintChange:
    name = "constraint"

    def __call__(self, record: Prompt, rng: random.Random) -> Prompt:
        if _SYNTHETIC.match(record.question) is None:
            raise VariantFailed("constraint changes are made for synthetic 'What is ...?' questions only")
        steps = binary_chain(record.solution)
        if len(steps) < 2:
            raise VariantFailed("one step: no order to change")
        for k in rng.sample(range(len(steps) - 1), len(steps) - 1):
            ops = [(s.op, s.right) for s in steps]
            ops[k], ops[k + 1] = ops[k + 1], ops[k]
            try:
                return self._rebuild(record, steps[0].left, ops)
            except VariantFailed:
                continue
        raise VariantFailed("no order swap keeps every result a non-negative integer and changes the answer")

    @staticmethod
    def _rebuild(record: Prompt, start: Fraction, ops: list[tuple[str, Fraction]]) -> Prompt:
        value, expression, lines = start, _text(start), []
        for op, operand in ops:
            expr = f"{_text(value)}{op}{_text(operand)}"
            new = evaluate(expr)
            if new < 0 or new.denominator != 1:
                raise VariantFailed(f"step {expr} leaves the non-negative integers")
            lines.append(f"<<{expr}={_text(new)}>>{_text(new)}")
            if op in "*/" and " " in expression:  # parentheses keep left-to-right order = the steps
                expression = f"({expression})"
            expression = f"{expression} {op} {_text(operand)}"
            value = new
        if value == number_value(record.answer):
            raise VariantFailed("the swap leaves the answer unchanged")
        question = f"What is {expression}?"
        return replace(record, columns=None, question=question, prompt=record.prompt.replace(record.question, question),
                       answer=_text(value), solution="\n".join(lines) + f"\n#### {_text(value)}")
