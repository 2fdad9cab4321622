"""Max-variance down-sampling (`rollout.oversample=k`, after PODS): roll out k x G rows per prompt,
keep the G whose rewards vary most.

Among subsets of a fixed size, the one with the largest variance is always some i lowest values
plus the G - i highest (moving any kept value toward the middle shrinks the spread), so G + 1
candidates per group are checked instead of C(kG, G). Only counted rows compete (scored, kept by
the reward filters); a group with fewer than G of them is filled with its other rows, which stay
out of the statistics. Ties go to the subset with more distinct rows (not near-copies), then to
fewer low values; within equal rewards, distinct rows are taken first.
"""

from __future__ import annotations

import torch


def _variance(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


def max_variance_rows(rewards: list[float], counted: list[bool], distinct: list[bool], keep: int) -> list[int]:
    """Indices (ascending) of the `keep` rows to keep from one group."""
    rows = [i for i, c in enumerate(counted) if c]
    if len(rows) <= keep:
        rest = [i for i, c in enumerate(counted) if not c]
        return sorted(rows + rest[: keep - len(rows)])
    # distinct rows first among equal rewards, at whichever end they are taken from
    low = sorted(rows, key=lambda i: (rewards[i], not distinct[i], i))
    high = sorted(rows, key=lambda i: (-rewards[i], not distinct[i], i))
    best, best_key = None, None
    for i in range(keep + 1):
        chosen = low[:i]
        taken = set(chosen)
        for j in high:
            if len(chosen) == keep:
                break
            if j not in taken:
                chosen.append(j)
                taken.add(j)
        key = (_variance([rewards[j] for j in chosen]), sum(distinct[j] for j in chosen), -i)
        if best_key is None or key > best_key:
            best, best_key = chosen, key
    return sorted(best)


def max_variance_subset(rewards: torch.Tensor, counted: torch.Tensor, distinct: torch.Tensor,
                        keep: int) -> torch.Tensor:
    """rewards, counted, distinct: [n, kG] -> [n, keep] row indices within each group."""
    r, c, d = rewards.double().tolist(), counted.tolist(), distinct.tolist()
    picked = [max_variance_rows(r[b], c[b], d[b], keep) for b in range(len(r))]
    return torch.tensor(picked, dtype=torch.long, device=rewards.device).reshape(len(r), keep)
