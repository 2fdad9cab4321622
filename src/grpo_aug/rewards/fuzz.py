"""Hostile completions for the rewards: what a collapsing policy (or an adversary) writes.

`cases(n, seed)` yields n strings of up to 32k characters: random text over a calculation-heavy
alphabet, and adversarial shapes (huge exponents, 10^6-digit numbers, deep nesting, unicode
digits, NaN/inf spellings, division by zero, long repetitions, unclosed markers). `run` feeds
each through `mathtext.evaluate` and every shipped reward and reports escapes and the slowest call.
Used by tests/unit/test_fuzz_rewards.py (a subset) and scripts/fuzz_rewards.py (the full run).
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

from grpo_aug.answers import AUTO, AnswerFormat
from grpo_aug.data.records import Prompt
from grpo_aug.mathtext import NotArithmetic, evaluate
from grpo_aug.rewards.math import MathReward
from grpo_aug.rewards.soft_math import SoftMathReward
from grpo_aug.rewards.text import FormatReward, RepetitionReward, ScriptReward, SimilarityReward, ThinkAnswerFormat

MAX_CHARS = 32_000
PROMPT = Prompt(id="fuzz", question="Natalia sold 48 clips in April and half as many in May. How many in total?",
                prompt="Q: ...\nA: ", answer="72", solution="<<48/2=24>>24\n<<48+24=72>>72\n#### 72", bucket="easy")

_ALPHABET = "0123456789" * 4 + "+-*/=().,%$e<>#: \n" + "xX×÷−" + "A" + "١٢٣߁𝟗" + "\\{}boxed" + "nainf"
_PIECES = [
    "<<", ">>", "=", "####", "\\boxed{", "}", "<answer>", "</answer>", "\\frac{", "\\dfrac", "\\text{",
    "The answer is ", "\nA: ", "1e999", "1e999999999", "-1e-999999",
    "inf", "-inf", "nan", "NaN", "Infinity", "1/0", "0/0", "(", ")", "((((((((((", "))))))))))", "9" * 400,
    "1,", "1,1,1,1,1,1,1,1", ".5", "5.", "½", "٣", "𝟗", "\u0000", "\ufffd", "%", "$", "x", "÷", "−", "**", "^",
    "__import__", "lambda", "1j", "0x1F", "1_000", "<<48/2=24>>", "48/2 = 24", "24\n", "#### 72", " ",
]


def _adversarial(rng: random.Random) -> str:
    kind = rng.randrange(14)
    if kind == 0:  # a claimed result with an absurd exponent
        return f"<<{rng.randint(1, 99)}+{rng.randint(1, 99)}=1e{rng.choice(['999', '999999999', '-999999999'])}>>"
    if kind == 1:  # an expression with a huge float literal or exponent
        return f"<<{rng.choice(['1e999', '1e308*10', '9e307+9e307', '1e-999'])}={rng.randint(0, 9)}>>"
    if kind == 2:  # a number with up to a million digits, as answer or operand
        size = rng.choice([400, 5000, 50_000, 1_000_000])  # cut to MAX_CHARS below; built in blocks for speed
        digits = ("".join(rng.choices("0123456789", k=min(size, 1000))) * (size // 1000 + 1))[:size]
        return rng.choice([f"#### {digits}", f"<<{digits[:150]}*2={digits}>>", f"A: {digits}", digits + " = " + digits])
    if kind == 3:  # deep nesting
        depth = rng.choice([20, 100, 1000, 10_000])
        return "<<" + "(" * depth + "1" + ")" * depth + "=1>>" + "(" * depth
    if kind == 4:  # collapse: one calculation repeated
        return "<<48/2=24>>" * rng.choice([200, 2000, 2900])
    if kind == 5:  # collapse: a comma run after the answer marker
        return "A: " + ",".join(["1"] * rng.choice([1000, 3000, 10_000]))
    if kind == 6:  # unicode digits and look-alike operators
        return rng.choice(["<<١٢+٣=١٥>>", "#### ٧٢", "<<𝟗×𝟗=81>>", "48−24 = 24", "\\boxed{٧٢}", "<<½+½=1>>"])
    if kind == 7:  # NaN / inf spellings where a number is expected
        marker = rng.choice(['####', 'The answer is', 'A:', '<<1+1='])
        return f"{marker} {rng.choice(['nan', 'inf', '-inf', 'Infinity', 'NaN'])}>>"
    if kind == 8:  # division by zero in every place
        return rng.choice(["<<1/0=1>>", "<<0/0=0>>", "#### 1/0", "\\boxed{0/0}", "5/0 = 1", "<<2=1/0>>"])
    if kind == 9:  # unclosed and interleaved markers
        return rng.choice(["<<" * 5000, "<<1+1=" * 3000, "\\boxed{" * 5000, "#### " * 5000, "<<1" + "+1" * 6000,
                           "<answer>" * 4000, "</answer><answer>" * 2000, "\\boxed{\\frac{" * 2000,
                           "<answer>\\boxed{" + "{" * 5000 + "}" * 5000 + "</answer>"])
    if kind == 10:  # plain calculations with long operands and many operators
        return " + ".join(str(rng.randint(0, 10**9)) for _ in range(rng.choice([10, 100, 3000]))) + " = 5"
    if kind == 11:  # long runs of one character class
        return rng.choice("1,.=<>(x ") * rng.choice([1000, 10_000, MAX_CHARS])
    if kind == 12:  # a whole plausible solution repeated
        return ("Natalia sold <<48/2=24>>24 clips in May. 48 + 24 = 72\n#### 72\n") * rng.choice([1, 50, 500])
    return "".join(rng.choices(_PIECES, k=rng.choice([10, 200, 2000])))


def cases(n: int, seed: int = 0) -> Iterator[str]:
    """n hostile strings, each cut to MAX_CHARS; half random, half adversarial shapes."""
    rng = random.Random(seed)
    for i in range(n):
        if i % 2:
            text = _adversarial(rng)
            if rng.random() < 0.3:  # embedded in ordinary text
                text = "Half of 48 is 24. " + text + " So the answer is 72."
        else:
            text = "".join(rng.choices(_ALPHABET, k=rng.choice([1, 10, 100, 1000, 5000])))
        yield text[:MAX_CHARS]


RETIMES = 3  # extra timings of each function's slowest input


class Report(NamedTuple):
    calls: int
    escapes: list[tuple[str, str, str]]  # (function, exception, the input's first 80 characters)
    slowest: dict[str, tuple[float, str]]  # function -> (seconds of CPU, the input's first 80 characters)


def targets() -> dict[str, Callable[[str], object]]:
    """Everything that parses model text, each as text -> result."""
    rewards = [MathReward(), SoftMathReward(), SimilarityReward(), FormatReward(), RepetitionReward(), ScriptReward(),
               ThinkAnswerFormat("strict")]

    def evaluate_or_none(text: str) -> object:
        try:
            return evaluate(text)
        except NotArithmetic:
            return None

    formats = {"auto": AUTO, "boxed": AnswerFormat(["boxed"], fallback_last_number=False),
               "tag": AnswerFormat(["tag"], fallback_last_number=False)}
    out: dict[str, Callable[[str], object]] = {"evaluate": evaluate_or_none}
    for name, answer in formats.items():  # extraction, then normalisation and comparison
        out[f"answer_{name}"] = lambda text, a=answer: (a.extract(text), a.same(text, "42"))
    for r in rewards:
        out[r.name] = lambda text, r=r: r(PROMPT, text)
    whole = SoftMathReward(partial_uses_all_numbers=True)  # the check over every step's operands
    out["soft_math_uses_all_numbers"] = lambda text: whole(PROMPT, text)
    return out


def run(texts) -> Report:
    """Feed every text to every target; an escape is any exception (NotArithmetic included for
    everything but `evaluate`, which must raise nothing else). Time is this thread's CPU time, so
    other processes on a shared machine do not count against a call, and the garbage collector
    is paused: a collection triggered by objects other code left behind is not the call's cost.
    Each function's slowest input is then timed RETIMES more times and the fastest of those
    timings kept: a stall of the machine during one call is not the input's cost, while an input
    that is really slow is slow every time."""
    escapes, slowest, calls = [], {}, 0
    funcs = targets()
    gc.disable()
    try:
        for text in texts:
            calls += _feed(text, funcs, escapes, slowest)
        for name, (spent, text) in list(slowest.items()):
            retimed = [_cpu_seconds(funcs[name], text) for _ in range(RETIMES)]
            slowest[name] = (min(spent, *retimed), text)
    finally:
        gc.enable()
    return Report(calls, escapes, {name: (spent, text[:80]) for name, (spent, text) in slowest.items()})


def _cpu_seconds(fn: Callable[[str], object], text: str) -> float:
    start = time.thread_time()
    try:
        fn(text)
    except Exception:  # already recorded as an escape
        pass
    return time.thread_time() - start


def _feed(text: str, funcs, escapes: list, slowest: dict) -> int:
    for name, fn in funcs.items():
        start = time.thread_time()
        try:
            result = fn(text)
            if not name.startswith(("evaluate", "answer_")) and not isinstance(result, float):
                escapes.append((name, f"returned {result!r}", text[:80]))
        except Exception as err:  # everything counts: the run would die on it
            escapes.append((name, repr(err)[:200], text[:80]))
        spent = time.thread_time() - start
        if spent > slowest.get(name, (0.0, ""))[0]:
            slowest[name] = (spent, text)
    return len(funcs)
