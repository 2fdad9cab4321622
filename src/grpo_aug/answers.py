"""Answer formats (`answer=auto|boxed|tag`): where a completion states its final answer, and when
two answers are the same. Text is parsed, never evaluated; arithmetic goes through the bounded
evaluator in mathtext.

Markers, in the order `markers` lists them; the first one found in the completion decides, and
`pick` chooses its first or last occurrence (models restate, so `last` is the default):
    hash       '#### 42' (GSM8K's solutions)
    boxed      '\\boxed{...}' with nested braces (MATH, most instruct models)
    tag        '<answer>...</answer>' (R1-style); a \\boxed{} inside it is unwrapped
    answer_is  'The (final) answer is 42'
    a_line     an 'A: 42' line
    equals     a number right after '=', 'equals' or 'is equal to' ('So, 47 + 8 = 55.'): how
               instruct models state a result in prose (answer=free_text)
`patterns` are extra regexes (one group each), tried before the markers. With no marker found,
`fallback_last_number` takes the completion's last number.

Comparison: both answers are normalised (LaTeX spacing and sizing, \\text{} units, \\dfrac and
\\frac{a}{b}, $, %, degrees, a trailing '.', a leading 'x ='); if both are then numbers or simple
arithmetic (3/4, \\frac{3}{4}, 0.75, 1,000) they compare by exact value, else as normalised text.
Every scan is linear in the completion's length.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence
from fractions import Fraction

from grpo_aug.errors import UsageError
from grpo_aug.mathtext import ANSWER_NUMBER, NotArithmetic, evaluate

MAX_ANSWER_CHARS = 500  # a longer stated answer is junk, not an answer
PICKS = ("first", "last")

_NUM = ANSWER_NUMBER
_HASH = re.compile(r"####\s*(" + _NUM + ")")
_ANSWER_IS = re.compile(r"[Tt]he (?:final )?answer is[:\s]*(" + _NUM + ")")
_A_LINE = re.compile(r"(?:^|\n)\s*A:\s*(" + _NUM + ")")
_EQUALS = re.compile(r"(?:=|\bequals|\bis equal to)[ \t]*(" + _NUM + ")")
_ANY_NUMBER = re.compile(_NUM)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_OPEN_TAG, _CLOSE_TAG = "<answer>", "</answer>"


def _regex(pattern: re.Pattern) -> Callable[[str], list[str]]:
    return lambda text: pattern.findall(text)


def _braced(text: str, opener: re.Pattern) -> list[str]:
    """Contents of every `opener`'s balanced {...}, matched in one pass over the braces."""
    close_of, stack = {}, []
    for m in re.finditer(r"[{}]", text):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            close_of[stack.pop()] = m.start()
    out = []
    for m in opener.finditer(text):
        brace = m.end() - 1
        if brace in close_of:
            out.append(text[brace + 1 : close_of[brace]])
    return out


def _tagged(text: str) -> list[str]:
    """Contents of <answer>...</answer>: each opening tag pairs with the next closing tag."""
    opens, closes, i = [], [], text.find(_OPEN_TAG)
    while i >= 0:
        opens.append(i + len(_OPEN_TAG))
        i = text.find(_OPEN_TAG, i + 1)
    i = text.find(_CLOSE_TAG)
    while i >= 0:
        closes.append(i)
        i = text.find(_CLOSE_TAG, i + 1)
    out = []
    for start in opens:
        k = bisect.bisect_left(closes, start)
        if k < len(closes):
            inner = text[start : closes[k]].strip()
            boxed = _braced(inner, _BOXED)
            out.append(boxed[-1] if boxed else inner)
    return out


MARKERS: dict[str, Callable[[str], list[str]]] = {
    "hash": _regex(_HASH),
    "boxed": lambda text: _braced(text, _BOXED),
    "tag": _tagged,
    "answer_is": _regex(_ANSWER_IS),
    "a_line": _regex(_A_LINE),
    "equals": _regex(_EQUALS),
}

# -- normalisation ---------------------------------------------------------------------------
_DROP = [r"\left", r"\right", r"\displaystyle", r"\!", r"\,", r"\;", r"\:", r"\ ", r"\$", r"\%", "^{\\circ}",
         "^\\circ", "°", "~", "$", "%"]
_UNIT = re.compile(r"\\(?:text|mbox|mathrm)\{[^{}]{0,40}\}$")
_TEXT = re.compile(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]{0,200})\}")
_FRAC = re.compile(r"\\frac\{([^{}]{1,100})\}\{([^{}]{1,100})\}")
_FRAC_SHORT = re.compile(r"\\frac(\d)(\d)")
_ASSIGN = re.compile(r"^[A-Za-z]\s*=(?!=)")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_PLAIN_NUMBER = re.compile(_NUM)
_ARITH = re.compile(r"[0-9.+\-*/()]+", re.ASCII)


def normalize(answer: str) -> str:
    """A stated answer in canonical text form ('' when there is none)."""
    s = answer.strip()
    if len(s) > MAX_ANSWER_CHARS:
        return ""
    s = s.replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac").replace("{,}", ",")
    for token in _DROP:
        s = s.replace(token, "")
    s = s.strip()
    if _PLAIN_NUMBER.fullmatch(s):  # "1,234", "3 / 4": as GSM8K answers are written
        return s.replace(",", "").replace(" ", "")
    if _UNIT.search(s) and _UNIT.sub("", s).strip():  # "10 \text{ cm}" -> "10"
        s = _UNIT.sub("", s)
    s = _TEXT.sub(r"\1", s)
    s = _FRAC_SHORT.sub(r"\1/\2", s)
    for _ in range(4):  # nested fractions, innermost first
        s, n = _FRAC.subn(r"(\1)/(\2)", s)
        if not n:
            break
    s = s.replace(r"\cdot", "*").replace(r"\times", "*").replace(r"\div", "/")
    s = _ASSIGN.sub("", s)
    s = "".join(s.split()).rstrip(".")
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s


def value(canonical: str) -> Fraction | None:
    """The exact value of a normalised answer that is a number or simple arithmetic, else None."""
    if not canonical or not _ARITH.fullmatch(canonical):
        return None
    try:
        return evaluate(canonical)
    except NotArithmetic:
        return None


class AnswerFormat:
    """markers and fallback_last_number have no default: conf/answer/*.yaml set them, differently."""

    def __init__(self, markers: Sequence[str], fallback_last_number: bool, patterns: Sequence[str] = (),
                 pick: str = "last") -> None:
        unknown = [m for m in markers if m not in MARKERS]
        if unknown:
            raise UsageError(f"answer.markers: unknown marker(s) {unknown}; known: {list(MARKERS)}")
        if pick not in PICKS:
            raise UsageError(f"answer.pick must be one of {list(PICKS)}, got {pick!r}")
        compiled = []
        for i, pattern in enumerate(patterns):
            try:
                regex = re.compile(pattern)
            except re.error as err:
                raise UsageError(f"answer.patterns[{i}] = {pattern!r} is not a valid regex: {err}") from err
            if regex.groups != 1:
                raise UsageError(f"answer.patterns[{i}] = {pattern!r} must have exactly one group (the answer), "
                                 f"has {regex.groups}")
            compiled.append(_regex(regex))
        self.markers = tuple(markers)
        self.finders = [*compiled, *(MARKERS[m] for m in markers)]
        self.pick, self.fallback_last_number = pick, fallback_last_number

    def extract(self, completion: str) -> str | None:
        """The answer the completion states, as written, or None."""
        for find in self.finders:
            found = find(completion)
            if found:
                return found[0] if self.pick == "first" else found[-1]
        if self.fallback_last_number:
            numbers = _ANY_NUMBER.findall(completion)
            return numbers[-1] if numbers else None
        return None

    def same(self, stated: str | None, reference: str) -> bool:
        """Does the stated answer equal the reference (by value when both are numbers)?"""
        if stated is None:
            return False
        a, b = normalize(stated), normalize(reference)
        if not a or not b:
            return False
        va, vb = value(a), value(b)
        if va is not None and vb is not None:
            return va == vb
        return a == b

    def correct(self, completion: str, reference: str) -> bool:
        return self.same(self.extract(completion), reference)


# conf/answer/auto.yaml, for code that builds rewards without a config (tests, benchmarks)
AUTO = AnswerFormat(markers=("hash", "boxed", "answer_is", "a_line"), fallback_last_number=True)
