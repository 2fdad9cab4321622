"""Curriculum schedules: pure functions of the step that return difficulty-bucket weights."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from grpo_aug.data.records import BUCKETS


def _check_weights(weights: Mapping[str, float], where: str) -> dict[str, float]:
    for name, w in weights.items():
        if name not in BUCKETS:
            raise ValueError(f"{where}: unknown bucket {name!r}, expected one of {list(BUCKETS)}")
        if w < 0:
            raise ValueError(f"{where}: weight of {name!r} is negative ({w})")
    total = sum(weights.values())
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"{where}: weights must sum to 1, got {total:g}")
    return {b: float(weights.get(b, 0.0)) for b in BUCKETS}


class StagedSchedule:
    """Piecewise-constant weights: stage i applies while step < until_i * total_steps.

    The default config is easy-first: all easy early on, harder buckets mixed in later.
    """

    def __init__(self, stages: Sequence[Mapping]) -> None:
        if not stages:
            raise ValueError("curriculum.stages is empty")
        self.stages = []
        last = 0.0
        for i, stage in enumerate(stages):
            until = float(stage["until"])
            if not last < until <= 1.0:
                raise ValueError(f"curriculum.stages[{i}].until must increase within (0, 1], got {until}")
            last = until
            self.stages.append((until, _check_weights(stage["weights"], f"curriculum.stages[{i}].weights")))
        if last != 1.0:
            raise ValueError(f"curriculum.stages[-1].until must be 1.0, got {last}")

    def weights(self, step: int, total_steps: int) -> dict[str, float]:
        progress = step / max(total_steps, 1)
        for until, weights in self.stages:
            if progress < until:
                return weights
        return self.stages[-1][1]

    def buckets_used(self) -> set[str]:
        return {b for _, w in self.stages for b, x in w.items() if x > 0}
