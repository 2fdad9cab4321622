"""Nucleus (top-p) sampling without sorting the vocabulary at every token.

The nucleus is the smallest set of most likely tokens whose mass reaches top_p: token i is in it
when the mass of the tokens more likely than i is < top_p (the most likely token always is).
Sorting all V entries of every row at every token was half of a SmolLM2 rollout (49,152 entries;
issue 57), and a top-k window with a sort as fallback does not help here: at the temperature
ladder's 1.2 and 1.5 a 135M model's nucleus often spans thousands of tokens, and bfloat16 logits
tie at every window edge.

So no sort, as FlashInfer's sampling kernels do it, by rejection: draw a token from the whole
distribution (one cumulative sum, one binary search per row), test whether it is in the nucleus
(one pass: the mass above its probability), keep it if it is; otherwise every nucleus token is
more likely than the one drawn, so draw again among the tokens more likely than it. Each round
keeps a row with probability >= top_p and raises the row's floor, so few rounds run (about
1 / top_p draws per row on average) and every row ends (the most likely token is always kept).
A draw kept this way follows the nucleus's renormalised distribution exactly: the first draw is
the whole distribution conditioned on the nucleus, and each later draw is the same distribution
conditioned on a set that still holds the whole nucleus.

Tokens of equal probability on the nucleus's edge are all in or all out here (the mass strictly
above them decides); a sort kept whichever of them it happened to put first.
Vocabularies up to SORT_UP_TO tokens (the default tiny model's) keep the sort: it is as cheap
there, and it draws what it always drew from the same random stream.
"""

from __future__ import annotations

import torch

SORT_UP_TO = 1024


def cut_nucleus(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """sorted_probs [N, K] descending -> the same with the tokens outside the nucleus at 0."""
    outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p  # [N, K] mass before each token
    return sorted_probs.masked_fill(outside, 0.0)


def sorted_nucleus(probs: torch.Tensor, top_p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """probs [N, V] -> token ids [N] drawn from the nucleus found by sorting each row."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # [N, V]
    picked = torch.multinomial(cut_nucleus(sorted_probs, top_p), 1, generator=generator)  # [N, 1]
    return order.gather(-1, picked).squeeze(-1)


def mass_above(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """probs [N, V], tokens [N] -> the mass of the tokens strictly more likely than each row's token [N]."""
    own = probs.gather(-1, tokens[:, None])  # [N, 1]
    return probs.masked_fill(probs <= own, 0.0).sum(dim=-1)  # [N]


def in_nucleus(probs: torch.Tensor, tokens: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs [N, V], tokens [N] -> whether each row's token is in that row's nucleus [N] bool."""
    return mass_above(probs, tokens) < top_p


def draw(weights: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """weights [N, V] >= 0, each row with some mass -> one index per row [N], in proportion to the
    weights (inverse CDF: a zero weight is never drawn)."""
    cdf = weights.cumsum(dim=-1)  # [N, V]
    total = cdf[:, -1:]  # [N, 1]
    u = torch.rand(total.shape, generator=generator, dtype=cdf.dtype, device=cdf.device) * total  # [N, 1]
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # rand * total may round up to total
    return torch.searchsorted(cdf, u, right=True).squeeze(-1)  # [N] first index whose cdf exceeds u


def sample_nucleus(probs: torch.Tensor, top_p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """probs [N, V] (rows sum to 1) -> one token id per row [N], drawn from the renormalised nucleus."""
    if probs.shape[-1] <= SORT_UP_TO:
        return sorted_nucleus(probs, top_p, generator)
    tokens = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)  # [N]
    rows = torch.arange(probs.shape[0], device=probs.device)  # [R] rows still drawing
    weights = probs  # [R, V] each row's distribution above its floor
    while len(rows):
        drawn = draw(weights, generator)  # [R]
        # the first round has every row: no [N, V] copy of the probabilities
        kept = in_nucleus(probs if len(rows) == len(probs) else probs[rows], drawn, top_p)  # [R]
        tokens[rows[kept]] = drawn[kept]
        rows, drawn, weights = rows[~kept], drawn[~kept], weights[~kept]
        floor = weights.gather(-1, drawn[:, None])  # [R, 1] every nucleus token is more likely than this
        weights = weights.masked_fill(weights <= floor, 0.0)
    return tokens
