"""Near-copy removal inside a group and dropping of groups with too few distinct completions.

Two completions are near-copies when the Jaccard overlap of their word n-gram sets is at least
`threshold`; completions shorter than n words are compared whole (identical or not). The first
of a set of near-copies is kept. A group left with fewer than `min_unique` distinct completions
is dropped entirely: standardising a handful of rows fakes a std and so fakes advantages.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from grpo_aug.errors import UsageError


def word_ngrams(text: str, n: int) -> frozenset[tuple[str, ...]]:
    words = text.split()
    if len(words) < n:
        return frozenset([tuple(words)])
    return frozenset(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def jaccard(a: frozenset, b: frozenset) -> float:
    union = len(a | b)
    return len(a & b) / union if union else 1.0


def keep_distinct(texts: Sequence[str], ngram: int, threshold: float) -> list[bool]:
    """keep[i] is False when text i is a near-copy of an earlier kept text."""
    grams = [word_ngrams(t, ngram) for t in texts]
    kept: list[int] = []
    keep = []
    for i, g in enumerate(grams):
        copy = any(jaccard(g, grams[j]) >= threshold for j in kept)
        keep.append(not copy)
        if not copy:
            kept.append(i)
    return keep


def laid_out(flags: Sequence[Sequence[bool]]) -> torch.Tensor:
    """[B, G] bool from per-group lists of different lengths (G the longest), False past each end."""
    width = max(len(row) for row in flags)
    return torch.tensor([list(row) + [False] * (width - len(row)) for row in flags], dtype=torch.bool)


class NoDedup:
    """`rollout/dedup=none`: every completion counts and no group is dropped."""

    min_unique = 2

    def check_group_size(self, group_size: int) -> None:
        pass

    def __call__(self, completions: Sequence[Sequence[str]]) -> torch.Tensor:
        """[B, G] bool, G the largest group: every row of a group, none past its end."""
        return laid_out([[True] * len(row) for row in completions])

    def groups_kept(self, distinct: torch.Tensor) -> torch.Tensor:
        return distinct.sum(dim=1) >= self.min_unique  # [B]


class NgramDedup(NoDedup):
    """`rollout/dedup=ngram`: marks the distinct completions of each group, [B, G] bool."""

    def __init__(self, ngram: int = 8, threshold: float = 0.9, min_unique: int = 4) -> None:
        if ngram < 1:
            raise UsageError(f"rollout.dedup.ngram must be >= 1, got {ngram}")
        if not 0.0 < threshold <= 1.0:
            raise UsageError(f"rollout.dedup.threshold must be in (0, 1], got {threshold}")
        if min_unique < 2:
            raise UsageError(f"rollout.dedup.min_unique must be >= 2 (a std needs two rows), got {min_unique}")
        self.ngram = ngram
        self.threshold = threshold
        self.min_unique = min_unique

    def check_group_size(self, group_size: int) -> None:
        if self.min_unique > group_size:
            raise UsageError(
                f"rollout.dedup.min_unique={self.min_unique} exceeds rollout.group_size={group_size}: "
                "every group would be dropped"
            )

    def __call__(self, completions: Sequence[Sequence[str]]) -> torch.Tensor:
        return laid_out([keep_distinct(row, self.ngram, self.threshold) for row in completions])  # [B, G]
