"""How many of a batch's slots each difficulty bucket gets: mixed curriculum batches, and the
refills and selector spares of a mixed batch (drawn in its bucket proportions)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence


def systematic_counts(weights: Mapping[str, float], n: int, u: float) -> dict[str, int]:
    """n slots shared by weights (summing to 1) at the points (u + k) / n, k < n, u in [0, 1):
    each bucket gets floor or ceil of weight x n, summing to n."""
    counts, low = {}, 0.0
    for bucket, w in weights.items():
        high = low + w
        # slots whose point falls in [low, high): those k with low <= (u + k) / n < high
        counts[bucket] = max(0, math.ceil(high * n - u) - math.ceil(low * n - u))
        low = high
    # weights that sum to 1 +- 1e-16 can miss or add a slot at the end: the heaviest bucket settles it
    counts[max(weights, key=weights.get)] += n - sum(counts.values())
    return counts


def spread_like(batch: Sequence, n: int) -> dict[str, int]:
    """n prompts shared over the batch's buckets in its proportions (refills and spares of a mixed
    batch); a one-bucket batch gives all n to its bucket."""
    buckets = [p.bucket for p in batch]
    shares = {b: buckets.count(b) / len(buckets) for b in dict.fromkeys(buckets)}
    return {b: k for b, k in systematic_counts(shares, n, 0.5).items() if k > 0}


def draw_like(pool: Callable[..., list], batch: Sequence, n: int, *args, **kwargs) -> list:
    """Up to n fresh prompts from `pool` (bucket, n, *args) in the batch's bucket proportions."""
    return [p for bucket, k in spread_like(batch, n).items() for p in pool(bucket, k, *args, **kwargs)]
