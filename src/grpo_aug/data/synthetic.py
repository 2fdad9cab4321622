"""Synthetic arithmetic with difficulty by construction: 1, 2 or 3 calculator steps.

easy   "What is 47 + 8?"             one addition of a single digit: <<47+8=55>>55 #### 55
medium "What is 47 + 8 - 5?"         two steps, each adding or subtracting a single digit
hard   "What is (47 + 38) * 3 - 12?" three steps, operands up to max_operand, multiplications by 2..9
Medium composes the easy skill (plus subtraction), so a small model warmed up on easy and medium
problems is sometimes right on both: the default tiny model starts near 0.2 on medium and GRPO
has groups with spread beyond the easy tier. Hard stays out of its reach, the data a curriculum
and a prompt selector have to learn to leave alone.
Results are never negative; generation is deterministic by seed.
"""

from __future__ import annotations

import random

from grpo_aug.data.records import BUCKETS, Prompt

# bucket: (calculator steps, operations, largest operand after the first; None: max_operand)
_TIERS = {"easy": (1, "+", 9), "medium": (2, "+-", 9), "hard": (3, "+-*", None)}


def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _problem(rng: random.Random, bucket: str, max_operand: int) -> tuple[str, list[str], int]:
    steps, ops, second_max = _TIERS[bucket]
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
    """`size_per_bucket` distinct problems per difficulty bucket, operands in [0, max_operand]."""

    def __init__(self, size_per_bucket: int = 900, max_operand: int = 99, seed: int = 0,
                 prompt_template: str = "Q: {question}\nA: ") -> None:
        if size_per_bucket < 1:
            raise ValueError(f"data.source.size_per_bucket must be >= 1, got {size_per_bucket}")
        self.size_per_bucket = size_per_bucket
        self.max_operand = max_operand
        self.seed = seed
        self.prompt_template = prompt_template

    def load(self, on_bad_row: str = "raise") -> list[Prompt]:  # generated rows are never bad
        records = []
        for bucket in BUCKETS:
            rng = random.Random(f"{self.seed}-{bucket}")
            seen: set[str] = set()
            attempts = 0
            while len(seen) < self.size_per_bucket:
                attempts += 1
                if attempts > 50 * self.size_per_bucket:
                    raise ValueError(
                        f"data.source: cannot make {self.size_per_bucket} distinct {bucket} problems "
                        f"with max_operand={self.max_operand}"
                    )
                expression, lines, answer = _problem(rng, bucket, self.max_operand)
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
