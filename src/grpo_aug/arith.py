"""A small, bounded arithmetic evaluator for text that comes from data or from the model.

Only numbers, + - * / and parentheses (and unary minus) are accepted; the expression is parsed
with Python's `ast` into a tree that is walked here, never compiled or executed. Values are exact
Fractions. Bounds keep a hostile or garbled input cheap: the text length, the number of nodes,
the nesting depth and the size of every intermediate value are capped.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction

MAX_CHARS = 200
MAX_NODES = 64
MAX_DEPTH = 16
MAX_ABS = Fraction(10) ** 15  # larger intermediate values are junk for grade-school arithmetic

_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}
# written forms that mean the same operator; the thousands separator "," and "$" are dropped
_REWRITE = str.maketrans({"×": "*", "x": "*", "X": "*", "÷": "/", "−": "-", "$": None, ",": None})
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)%")


class NotArithmetic(ValueError):
    """The expression is not plain bounded arithmetic (or divides by zero)."""


def evaluate(expression: str) -> Fraction:
    """Exact value of `expression`, e.g. '48/2+3*(4-1)' -> Fraction(33). Raises NotArithmetic."""
    if len(expression) > MAX_CHARS:
        raise NotArithmetic(f"expression longer than {MAX_CHARS} characters")
    text = _PERCENT.sub(r"(\1/100)", expression.translate(_REWRITE)).strip()
    if not text:
        raise NotArithmetic("empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as err:
        raise NotArithmetic(f"not an arithmetic expression: {expression!r}") from err
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise NotArithmetic(f"expression has more than {MAX_NODES} parts")
    return _value(tree.body, 0)


def _value(node: ast.AST, depth: int) -> Fraction:
    if depth > MAX_DEPTH:
        raise NotArithmetic(f"expression nested deeper than {MAX_DEPTH}")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = Fraction(str(node.value))  # via str: 0.1 stays 1/10, not the binary float
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _value(node.operand, depth + 1)
        value = -inner if isinstance(node.op, ast.USub) else inner
    elif isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left, depth + 1), _value(node.right, depth + 1)
        if isinstance(node.op, ast.Div) and right == 0:
            raise NotArithmetic("division by zero")
        value = _OPS[type(node.op)](left, right)
    else:
        raise NotArithmetic(f"unsupported element {type(node).__name__} in arithmetic")
    if abs(value) > MAX_ABS:
        raise NotArithmetic(f"intermediate value beyond {MAX_ABS}")
    return value


def matches(value: Fraction, claimed: str) -> bool:
    """Does `claimed` (as written, e.g. '3.33') state `value`, up to the decimals it shows?

    Worked solutions round: <<10/3=3.33>> is a correct step, <<10/3=3.4>> is not.
    """
    text = claimed.replace(",", "").replace("$", "").strip()
    try:
        stated = Fraction(text)
    except (ValueError, ZeroDivisionError):
        return False
    if stated == value:
        return True
    decimals = len(text.split(".", 1)[1]) if "." in text else 0
    if decimals == 0:
        return False
    return abs(value - stated) <= Fraction(1, 2 * 10**decimals)
