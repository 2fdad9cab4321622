"""Numbers and calculations in text that comes from data or from the model, in one place.

The written forms (`WRITTEN_NUMBER` for operands, `ANSWER_NUMBER` for final answers with sign,
$, fraction or %, `ANNOTATION` for `<<expr=result>>` calculator steps), number normalisation, and a
small, bounded arithmetic evaluator. Used by the data side (GSM8K loading, prompt variants) and
the reward side (answer extraction, process checks) alike.

Only numbers, + - * / and parentheses (and unary minus) are accepted; the expression is parsed
with Python's `ast` into a tree that is walked here, never compiled or executed. Values are exact
Fractions. Bounds keep a hostile or garbled input cheap: the text length, the number of nodes,
the nesting depth and the size of every intermediate value are capped, and a number is checked
for its length and exponent before it becomes a Fraction ("1e999999999" would otherwise be a
billion-digit integer). Nothing here raises anything but NotArithmetic, whatever the input.
"""

from __future__ import annotations

import ast
import math
import re
import warnings
from fractions import Fraction

MAX_CHARS = 200
MAX_NODES = 64
MAX_DEPTH = 16
MAX_ABS = Fraction(10) ** 15  # larger intermediate values are junk for grade-school arithmetic
MAX_NUMBER_CHARS = 64  # a written number longer than this is junk
MAX_EXPONENT = 30  # |e| of a written 1.5e3; beyond it the value is junk here
# ASCII only: int() would also read other scripts' digits, which a completion should not pass off
_NUMBER = re.compile(r"[-+]?(?:\d+/(\d+)|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE]([-+]?\d+))?)", re.ASCII)

_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}
# written forms that mean the same operator; the thousands separator "," and "$" are dropped
_REWRITE = str.maketrans({"×": "*", "x": "*", "X": "*", "÷": "/", "−": "-", "$": None, ",": None})
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)%")
# what a written calculation may contain once rewritten; Python-only forms ('1_000', '0x1F', '1e5',
# other scripts' digits) are not arithmetic as people write it
_ALLOWED = re.compile(r"[0-9.+\-*/()\s]*", re.ASCII)


# an unsigned written number: digits, thousands separators, decimals ("1,234.5")
WRITTEN_NUMBER = r"\d[\d,]*(?:\.\d+)?"
# a final answer as people write it: sign, $, fraction and % allowed ("-$1,234.50", "3 / 4", "50%")
ANSWER_NUMBER = r"-?\$?\s?\d[\d,]*(?:\.\d+)?(?:\s?/\s?\d+)?%?"
# a calculator step `<<48/2=24>>`, bounded so that a hostile completion cannot make it slow
ANNOTATION = re.compile(r"<<([^<>=]{1,200})=([^<>=]{1,40})>>")


class NotArithmetic(ValueError):
    """The expression is not plain bounded arithmetic (or divides by zero)."""


def to_fraction(text: str) -> Fraction:
    """Exact value of one written number ('24', '-0.5', '3/4', '1.5e3'); raises NotArithmetic
    for anything else, and for numbers too long or with too large an exponent to be arithmetic."""
    text = text.strip()
    if len(text) > MAX_NUMBER_CHARS:
        raise NotArithmetic(f"number longer than {MAX_NUMBER_CHARS} characters")
    match = _NUMBER.fullmatch(text)
    if match is None:
        raise NotArithmetic(f"not a number: {text[:MAX_NUMBER_CHARS]!r}")
    denominator, exponent = match.groups()
    if exponent is not None and abs(int(exponent)) > MAX_EXPONENT:
        raise NotArithmetic(f"exponent beyond {MAX_EXPONENT}: {text!r}")
    if denominator is not None and int(denominator) == 0:
        raise NotArithmetic("division by zero")
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError) as err:
        raise NotArithmetic(f"not a number: {text!r}") from err


def number_or_none(text: str) -> Fraction | None:
    """to_fraction, with None for anything that is not a bounded number."""
    try:
        return to_fraction(text)
    except NotArithmetic:
        return None


def evaluate(expression: str) -> Fraction:
    """Exact value of `expression`, e.g. '48/2+3*(4-1)' -> Fraction(33). Raises NotArithmetic."""
    try:
        return _evaluate(expression)
    except NotArithmetic:
        raise
    except (ValueError, ArithmeticError, RecursionError, MemoryError, TypeError) as err:
        # the bounds below should make these unreachable; a completion must still never escape
        raise NotArithmetic(f"not bounded arithmetic: {type(err).__name__}") from None


def _evaluate(expression: str) -> Fraction:
    if len(expression) > MAX_CHARS:
        raise NotArithmetic(f"expression longer than {MAX_CHARS} characters")
    text = _PERCENT.sub(r"(\1/100)", expression.translate(_REWRITE)).strip()
    if not text:
        raise NotArithmetic("empty expression")
    if not _ALLOWED.fullmatch(text):
        raise NotArithmetic(f"not an arithmetic expression: {expression!r}")
    try:
        with warnings.catch_warnings():  # '2(3)' parses with a SyntaxWarning; it is rejected below anyway
            warnings.simplefilter("ignore", SyntaxWarning)
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
        if isinstance(node.value, float) and not math.isfinite(node.value):  # '1e999' parses as inf
            raise NotArithmetic("number too large")
        if isinstance(node.value, int) and abs(node.value) > MAX_ABS:
            raise NotArithmetic(f"number beyond {MAX_ABS}")
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
    stated = number_or_none(text)
    if stated is None:
        return False
    if stated == value:
        return True
    decimals = len(text.split(".", 1)[1]) if "." in text and "e" not in text.lower() else 0
    if decimals == 0:
        return False
    return abs(value - stated) <= Fraction(1, 2 * 10**decimals)


def normalize_number(raw: str) -> str | None:
    """'$1,234.00' -> '1234', '50%' -> '50', ' 3 / 4' -> '3/4', '-0.50' -> '-0.5'; None if it is
    not a bounded number."""
    s = raw.replace(",", "").replace("$", "").replace("%", "").replace(" ", "")
    value = number_or_none(s)
    if value is None:
        return None
    if value.denominator == 1:
        return str(value.numerator)
    if "/" in s:
        return f"{value.numerator}/{value.denominator}"
    return s.rstrip("0").rstrip(".") if "." in s else s
