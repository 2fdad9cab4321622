"""Synthetic arithmetic with difficulty by construction: 1, 2 or 3 calculator steps.

easy   "What is 47 + 8?"             one addition of a single digit: <<47+8=55>>55 #### 55
medium "What is 47 + 8 - 5?"         two steps, each adding or subtracting a single digit
hard   "What is 47 + 8 - 5 + 3?"     three such steps
Each tier composes the one below, so a small model warmed up on easy and medium problems is
sometimes right on medium (the default tiny model starts near 0.2) and hard is one more step of
the same skill: the frontier GRPO has to push. `tiers` makes any tier harder: e.g. hard
{steps: 3, ops: "+-*", operand: null} is "(47 + 38) * 3 - 12" (operands up to max_operand,
multiplications by 2..9), the hard tier until 2026-12-02, which no run of the 1M-parameter
default model ever solved (docs/history/sample-efficiency-2026-12-01-to-03.md).
Results are never negative; generation is deterministic by seed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from grpo_aug.data.records import BUCKETS, Prompt
from grpo_aug.errors import UsageError

# bucket -> calculator steps, operations, largest operand after the first (None: max_operand)
TIERS = {"easy": {"steps": 1, "ops": "+", "operand": 9}, "medium": {"steps": 2, "ops": "+-", "operand": 9},
         "hard": {"steps": 3, "ops": "+-", "operand": 9}}


def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _tier(bucket: str, spec: Mapping) -> tuple[int, str, int | None]:
    unknown = set(spec) - {"steps", "ops", "operand"}
    if unknown:
        raise UsageError(f"data.source.tiers.{bucket}: unknown keys {sorted(unknown)} (steps, ops, operand)")
    steps, ops, operand = int(spec["steps"]), str(spec["ops"]), spec.get("operand")
    if steps < 1:
        raise UsageError(f"data.source.tiers.{bucket}.steps must be >= 1, got {steps}")
    if not ops or set(ops) - set("+-*"):
        raise UsageError(f"data.source.tiers.{bucket}.ops must be a non-empty string of + - *, got {ops!r}")
    if operand is not None and int(operand) < 0:
        raise UsageError(f"data.source.tiers.{bucket}.operand must be >= 0 or null, got {operand}")
    return steps, ops, None if operand is None else int(operand)


def _problem(rng: random.Random, tier: tuple[int, str, int | None], max_operand: int) -> tuple[str, list[str], int]:
    steps, ops, second_max = tier
    second_max = max_operand if second_max is None else second_max
    value = rng.randint(0, max_operand)
    expression = str(value)
    lines = []
    for _ in range(steps):
        op = rng.choice(ops) if len(ops) > 1 else ops  # easy draws no operation: its problems stay as before
        b = rng.randint(2, 9) if op == "*" else rng.randint(0, second_max)
        if op == "-" and b > value:  # keep every intermediate result non-negative
            op = "+"
        result = _apply(op, value, b)
        lines.append(f"<<{value}{op}{b}={result}>>{result}")
        if op == "*" and " " in expression:  # parentheses keep left-to-right order = the steps
            expression = f"({expression})"
        expression = f"{expression} {op} {b}"
        value = result
    return expression, lines, value


class SyntheticArithmetic:
    """`size_per_bucket` distinct problems per difficulty bucket, operands in [0, max_operand];
    tiers: per bucket, what overrides TIERS (steps, ops, operand)."""

    def __init__(self, size_per_bucket: int = 900, max_operand: int = 99, seed: int = 0,
                 prompt_template: str = "Q: {question}\nA: ", tiers: Mapping[str, Mapping] | None = None) -> None:
        if size_per_bucket < 1:
            raise UsageError(f"data.source.size_per_bucket must be >= 1, got {size_per_bucket}")
        self.size_per_bucket = size_per_bucket
        self.max_operand = max_operand
        self.seed = seed
        self.prompt_template = prompt_template
        unknown = set(tiers or {}) - set(BUCKETS)
        if unknown:
            raise UsageError(f"data.source.tiers: unknown buckets {sorted(unknown)}, expected {list(BUCKETS)}")
        self.tiers = {b: _tier(b, {**TIERS[b], **(tiers or {}).get(b, {})}) for b in BUCKETS}

    def load(self, on_bad_row: str = "raise") -> list[Prompt]:  # generated rows are never bad
        records = []
        for bucket in BUCKETS:
            rng = random.Random(f"{self.seed}-{bucket}")
            seen: set[str] = set()
            attempts = 0
            while len(seen) < self.size_per_bucket:
                attempts += 1
                if attempts > 50 * self.size_per_bucket:
                    raise UsageError(
                        f"data.source: cannot make {self.size_per_bucket} distinct {bucket} problems "
                        f"with max_operand={self.max_operand}"
                    )
                expression, lines, answer = _problem(rng, self.tiers[bucket], self.max_operand)
                question = f"What is {expression}?"
                if question in seen:
                    continue
                seen.add(question)
                records.append(Prompt(
                    id=f"synthetic-{bucket}-{len(seen) - 1}",
                    question=question,
                    prompt=self.prompt_template.format(question=question),
                    answer=str(answer),
                    solution="\n".join(lines) + f"\n#### {answer}",
                    bucket=bucket,
                ))
        return records

    def load_heldout(self, on_bad_row: str = "raise") -> None:
        return None
