"""Prompt variants: more distinct prompts from the same problems, answers recomputed, never guessed.

`data.variants.kinds` lists variant makers (`_target_` each); `data.variants.per_prompt` is how
many variants each training record gets (attempts that fail are not replaced by copies).
Variants are made from training records only, after the held-out split, and a variant whose
question is a held-out question is dropped, so a held-out problem never reaches training in
disguise. Each keeps its source's bucket and links to it (`source_id`).

NumericSubstitution: the question's numbers are replaced consistently (same number of digits,
same decimals) and the reference solution's calculator chain `<<expr=result>>` is re-evaluated
step by step with the bounded evaluator in `grpo_aug.mathtext`. A variant is kept only when every
step evaluates cleanly: the original step checks out, no division by zero, and no negative,
fractional or long-decimal result where the original had none. Numbers a solution may use for a
word ("twice" = 2, "a dozen" = 12, 60 minutes) are never substituted, and neither is a number
that no step uses (e.g. the 20 of "20%" when the solution computes with 0.2).

Rephrase (synthetic arithmetic only): the same computation in other words: operands of an
addition swapped, "8 more than 47", a step-by-step instruction, or another request form.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection, Sequence
from dataclasses import replace
from fractions import Fraction

from grpo_aug.data.records import Prompt
from grpo_aug.errors import UsageError
from grpo_aug.mathtext import ANNOTATION, WRITTEN_NUMBER, NotArithmetic, evaluate, matches

NUMBER = re.compile(r"(?<![\d.])" + WRITTEN_NUMBER)
# values that often stand for a word in the question ("twice", "half", "a dozen", "per hour")
WORD_VALUES = frozenset(Fraction(v) for v in (0, 1, 2, 3, 4, 7, 10, 12, 24, 30, 52, 60, 100, 365, 1000))
MAX_DECIMALS = 2


class VariantFailed(ValueError):
    """This record cannot be varied (kept out, never replaced by a guess)."""


class BadDraw(VariantFailed):
    """These particular new numbers do not work (a step turned negative or fractional); others may."""


def number_value(text: str) -> Fraction:
    return Fraction(text.replace(",", ""))


def _decimals(text: str) -> int:
    return len(text.split(".", 1)[1]) if "." in text else 0


def format_like(value: Fraction, like: str) -> str:
    """`value` written like `like`: thousands separators kept, decimals only as needed."""
    if value.denominator == 1:
        text = str(value.numerator)
    else:
        for places in range(1, MAX_DECIMALS + 1):
            if (value * 10**places).denominator == 1:
                text = f"{float(value):.{places}f}"
                break
        else:
            raise BadDraw(f"{value} has more than {MAX_DECIMALS} decimals")
    if "," in like and value.denominator == 1:
        text = f"{value.numerator:,}"
    return text


def _same_shape(old: str, rng: random.Random) -> str:
    """A different number with the same digit count and decimals as `old` (written form kept)."""
    plain = old.replace(",", "")
    whole, _, frac = plain.partition(".")
    digits = len(whole.lstrip("0")) or 1
    for _ in range(20):
        low = 10 ** (digits - 1) if digits > 1 else 2
        new_whole = rng.randint(low, 10**digits - 1)
        new = str(new_whole) + ("." + "".join(str(rng.randint(0, 9)) for _ in frac) if frac else "")
        if new != plain:
            return f"{new_whole:,}" + new[len(str(new_whole)):] if "," in old else new
    raise BadDraw(f"no other number shaped like {old}")


class NumericSubstitution:
    """`tries` fresh draws of numbers per variant before giving up (a division must stay exact)."""

    name = "numeric"

    def __init__(self, keep_values: Sequence[float] | None = None, tries: int = 10) -> None:
        if tries < 1:
            raise UsageError(f"data.variants NumericSubstitution tries must be >= 1, got {tries}")
        self.keep = WORD_VALUES if keep_values is None else frozenset(Fraction(str(v)) for v in keep_values)
        self.tries = tries

    def __call__(self, record: Prompt, rng: random.Random) -> Prompt:
        for _ in range(self.tries - 1):
            try:
                return self._draw(record, rng)
            except BadDraw:
                pass
        return self._draw(record, rng)

    def _draw(self, record: Prompt, rng: random.Random) -> Prompt:
        steps = ANNOTATION.findall(record.solution)
        if not steps:
            raise VariantFailed("the solution has no calculator steps")
        used = {number_value(n) for expr, _ in steps for n in NUMBER.findall(expr)}
        # question number (as a value) -> its new written form
        swap: dict[Fraction, str] = {}
        for text in NUMBER.findall(record.question):
            value = number_value(text)
            if value in used and value not in self.keep and value not in swap:
                swap[value] = _same_shape(text, rng)
        if not swap:
            raise VariantFailed("no question number feeds the calculation")
        results: dict[Fraction, Fraction] = {}  # old step result -> new step result
        new_steps = []
        for expr, claimed in steps:
            try:
                old_value = evaluate(expr)
            except NotArithmetic as err:
                raise VariantFailed(f"step {expr!r} does not evaluate: {err}") from None
            if not matches(old_value, claimed.strip()):
                raise VariantFailed(f"the original step {expr}={claimed} is wrong")
            new_expr = NUMBER.sub(lambda m: self._renumber(m.group(0), swap, results), expr)
            try:
                new_value = evaluate(new_expr)
            except NotArithmetic as err:
                raise BadDraw(f"step {new_expr!r} does not evaluate: {err}") from None
            old_claimed = number_value(claimed.strip().lstrip("$"))
            if new_value < 0 <= old_claimed:
                raise BadDraw(f"step {new_expr} turns negative")
            if new_value.denominator != 1 and old_claimed.denominator == 1:
                raise BadDraw(f"step {new_expr} turns fractional")
            results[old_claimed] = new_value
            new_steps.append((expr, claimed, new_expr, new_value))
        final = number_value(record.answer) if "/" not in record.answer else None
        if final is None or final not in results:
            raise VariantFailed("the final answer is not a step result")
        answer = format_like(results[final], record.answer)
        question = NUMBER.sub(lambda m: swap.get(number_value(m.group(0)), m.group(0)), record.question)
        solution = self._rewrite_solution(record.solution, new_steps, swap, results, answer)
        return replace(record, columns=None, question=question, prompt=record.prompt.replace(record.question, question),
                       answer=answer, solution=solution)

    @staticmethod
    def _renumber(text: str, swap: dict[Fraction, str], results: dict[Fraction, Fraction]) -> str:
        value = number_value(text)
        if value in results and value in swap and number_value(swap[value]) != results[value]:
            raise BadDraw(f"{text} is both a question number and an earlier result")
        if value in results:
            return format_like(results[value], text)
        return swap.get(value, text).replace(",", "")

    @staticmethod
    def _rewrite_solution(solution, new_steps, swap, results, answer) -> str:
        out = solution
        for expr, claimed, new_expr, new_value in new_steps:
            written = format_like(new_value, claimed)
            out = out.replace(f"<<{expr}={claimed}>>", f"<<{new_expr}={written}>>", 1)
        # numbers in the prose: earlier results first, then question numbers
        body, _, _ = out.rpartition("####")
        parts = re.split(r"(<<[^<>]*>>)", body)
        for i in range(0, len(parts), 2):
            parts[i] = NUMBER.sub(
                lambda m: format_like(results[number_value(m.group(0))], m.group(0))
                if number_value(m.group(0)) in results else swap.get(number_value(m.group(0)), m.group(0)), parts[i])
        return "".join(parts) + f"#### {answer}"


_SYNTHETIC = re.compile(r"^What is (.+)\?$")
_VERBS = {"+": "add", "-": "subtract", "*": "multiply by"}
_ASKS = ["Compute {expr}.", "Calculate {expr} and give the result.", "Find the value of {expr}.",
         "Evaluate {expr}. Answer with a number."]


class Rephrase:
    """Surface rephrasings of a synthetic arithmetic question; the answer is unchanged."""

    name = "rephrase"

    def __call__(self, record: Prompt, rng: random.Random) -> Prompt:
        m = _SYNTHETIC.match(record.question)
        if m is None:
            raise VariantFailed("not a synthetic 'What is ...?' question")
        expr = m.group(1)
        steps = [re.match(r"\s*(\d+)\s*([-+*])\s*(\d+)\s*$", e) for e, _ in ANNOTATION.findall(record.solution)]
        if not steps or any(s is None for s in steps):
            raise VariantFailed("the solution is not a chain of binary steps")
        forms = [lambda: rng.choice(_ASKS).format(expr=expr), lambda: self._instructions(steps)]
        if len(steps) == 1 and steps[0].group(2) == "+":
            a, b = steps[0].group(1), steps[0].group(3)
            forms += [lambda: f"What is {b} + {a}?", lambda: f"What is {b} more than {a}?"]
        question = rng.choice(forms)()
        return replace(record, columns=None, question=question, prompt=record.prompt.replace(record.question, question))

    @staticmethod
    def _instructions(steps) -> str:
        first = steps[0]
        phrases = [f"Start with {first.group(1)}"] + [f"{_VERBS[s.group(2)]} {s.group(3)}" for s in steps]
        return ", then ".join(phrases) + ". What number do you get?"


class Variants:
    """`per_prompt` variants of each record, made by the `kinds` in turn, deterministic by seed."""

    def __init__(self, per_prompt: int = 0, kinds: Sequence = (), seed: int = 0) -> None:
        if per_prompt < 0:
            raise UsageError(f"data.variants.per_prompt must be >= 0, got {per_prompt}")
        if per_prompt > 0 and not kinds:
            raise UsageError("data.variants.per_prompt > 0 but data.variants.kinds is empty")
        self.per_prompt, self.kinds, self.seed = per_prompt, list(kinds), seed
        self.attempts = 0
        self.failures: dict[str, int] = {}
        self.held_out = 0  # variants dropped because they are a held-out question

    def make(self, records: Sequence[Prompt], held_out: Collection[str] = ()) -> list[Prompt]:
        """Variants of `records`; none whose question is in `held_out` (new numbers can land exactly
        on a held-out problem: on the synthetic easy tier, 136 of 200 held-out questions did)."""
        held_out = frozenset(held_out)
        out = []
        for record in records:
            seen = {record.question}
            for k in range(self.per_prompt):
                kind = self.kinds[k % len(self.kinds)]
                rng = random.Random(f"{self.seed}-variant-{record.id}-{k}")
                self.attempts += 1
                try:
                    variant = kind(record, rng)
                except VariantFailed:
                    self.failures[kind.name] = self.failures.get(kind.name, 0) + 1
                    continue
                if variant.question in held_out:
                    self.held_out += 1
                    continue
                if variant.question in seen:
                    continue
                seen.add(variant.question)
                out.append(replace(variant, id=f"{record.id}~{kind.name}{k}", source_id=record.id))
        return out
