"""The calculator tool of the default task: bounded arithmetic (mathtext's evaluator, never eval)."""

from __future__ import annotations

from grpo_aug.mathtext import evaluate


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: numbers, + - * / and parentheses, e.g. "47+8" or "(12-3)*4".
    """
    value = evaluate(expression)  # raises NotArithmetic on anything else: an error in the transcript
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"
