"""How many rows each prompt of a step gets: the per-prompt rollout budget.

`rollout/budget=uniform` gives every prompt rollout.group_size rows. `rollout/budget=informative`
keeps the step's total (prompts x group_size rows) and shares it out by each prompt's predicted
pass rate p, as Knapsack RL and AR3PO allocate rollouts: a group of c rows has spread (is not flat)
with probability 1 - p^c - (1 - p)^c, so a row added to a near-certain prompt (p near 0 or 1) buys
almost nothing, while one added to a prompt at p = 0.1 buys a lot. Every prompt starts at
`min_rows`; each further row goes to the prompt whose chance of spread it raises most, up to
`max_rows`. A step's groups then differ in size: the rollout lays them out [B, max_rows] with the
missing rows marked absent (never scored, counted or trained on).

p comes from the prompt history (`PromptHistory.predicted_pass`, prompts/history.py): the prompt's
smoothed pass rate if it was rolled out before, else the mean over the prompts of its bucket that
were (else `prior`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from grpo_aug.errors import UsageError


def spread_probability(p: float, rows: int) -> float:
    """The chance that `rows` independent rows, each right with probability p, are not all equal."""
    return 1.0 - p**rows - (1.0 - p) ** rows


def allocate(pass_rates: Sequence[float], total: int, min_rows: int, max_rows: int) -> list[int]:
    """Rows per prompt summing to `total` (or len x max_rows, if less): min_rows each, then one
    row at a time to the prompt whose spread probability it raises most (ties: the prompt with
    fewer rows, then the earlier one; so prompts that gain nothing, p = 0 or 1, share evenly)."""
    rows = [min_rows] * len(pass_rates)
    left = min(total, max_rows * len(pass_rates)) - min_rows * len(pass_rates)

    def gain(b: int) -> float:
        return spread_probability(pass_rates[b], rows[b] + 1) - spread_probability(pass_rates[b], rows[b])

    heap = [(-gain(b), rows[b], b) for b in range(len(pass_rates)) if rows[b] < max_rows]
    heapq.heapify(heap)
    while left > 0 and heap:
        _, _, b = heapq.heappop(heap)
        rows[b] += 1
        left -= 1
        if rows[b] < max_rows:
            heapq.heappush(heap, (-gain(b), rows[b], b))
    return rows


class UniformBudget:
    """`rollout/budget=uniform`: group_size rows for every prompt."""

    active = False

    def width(self, group_size: int) -> int:
        return group_size

    def check(self, group_size: int, oversample: int, min_unique: int) -> None:
        pass

    def rows(self, pass_rates: Sequence[float], group_size: int) -> list[int]:
        """Rows for each prompt, given each prompt's predicted pass rate."""
        return [group_size] * len(pass_rates)


class InformativeBudget(UniformBudget):
    """`rollout/budget=informative`: the step's prompts x group_size rows, more to the prompts whose
    groups gain most from them (module docstring)."""

    active = True

    def __init__(self, min_rows: int = 4, max_rows: int = 16, prior: float = 0.5) -> None:
        if min_rows < 2:
            raise UsageError(f"rollout.budget.min_rows must be >= 2 (a group needs a std), got {min_rows}")
        if max_rows < min_rows:
            raise UsageError(f"rollout.budget.max_rows={max_rows} is below rollout.budget.min_rows={min_rows}")
        if not 0.0 <= prior <= 1.0:
            raise UsageError(f"rollout.budget.prior must be in [0, 1], got {prior}")
        self.min_rows, self.max_rows, self.prior = min_rows, max_rows, prior

    def width(self, group_size: int) -> int:
        return self.max_rows

    def check(self, group_size: int, oversample: int, min_unique: int) -> None:
        if not self.min_rows <= group_size <= self.max_rows:
            raise UsageError(f"rollout.group_size={group_size} must lie within rollout.budget.min_rows="
                             f"{self.min_rows} and max_rows={self.max_rows}: it is the mean group size")
        if oversample > 1:
            raise UsageError(f"rollout/budget=informative sizes each group itself; it does not combine with "
                             f"rollout.oversample={oversample} (down-sampling to group_size rows)")
        if min_unique > self.min_rows:
            raise UsageError(f"rollout.dedup.min_unique={min_unique} exceeds rollout.budget.min_rows="
                             f"{self.min_rows}: every smallest group would be dropped")

    def rows(self, pass_rates: Sequence[float], group_size: int) -> list[int]:
        return allocate(pass_rates, len(pass_rates) * group_size, self.min_rows, self.max_rows)
