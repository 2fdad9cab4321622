"""Nucleus (top-p) sampling without sorting the vocabulary at every token.

The nucleus is the smallest prefix of the descending distribution whose mass reaches top_p (a
token is kept while the mass before it is < top_p; the most likely token always is). Sorting all V
entries of every row at every token dominated the decode on a real vocabulary (49,152 entries:
half of a SmolLM2 rollout, issue 57). The nucleus almost always sits among the few hundred most
likely tokens, so each row takes its `window` largest probabilities (a top-k, which needs no full
sort) and cuts the nucleus there. That is exact unless
    the window's mass is < top_p (the nucleus spills past the window: a flat distribution), or
    the window's last probability ties with the next one outside it and is > 0 (which of the tied
    tokens a sort would put first is not the window's to decide),
and for those rows the full sort runs as before. vLLM does the same with a 1,024-token window.
"""

from __future__ import annotations

import torch

WINDOW = 1024


def cut_nucleus(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """sorted_probs [N, K] descending -> the same with the tokens outside the nucleus at 0."""
    outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p  # [N, K] mass before each token
    return sorted_probs.masked_fill(outside, 0.0)


def windowed_nucleus(probs: torch.Tensor, top_p: float, window: int = WINDOW
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """probs [N, V] -> (weights [N, W] with 0 outside the nucleus, their token ids [N, W], and
    exact [N]: whether the window holds the row's whole nucleus; rows with exact False need the
    full sort (`full_nucleus`)."""
    values, ids = probs.topk(window + 1, dim=-1)  # [N, W + 1] descending
    inside, edge = values[:, :window], values[:, window]  # [N, W], [N]
    spills = inside.sum(dim=-1) < top_p  # [N]
    tie = (inside[:, -1] == edge) & (edge > 0)  # [N]
    return cut_nucleus(inside, top_p), ids[:, :window], ~(spills | tie)


def full_nucleus(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """probs [N, V] -> (weights [N, V] in descending order with 0 outside the nucleus, ids [N, V])."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # [N, V]
    return cut_nucleus(sorted_probs, top_p), order


def sample_nucleus(probs: torch.Tensor, top_p: float, generator: torch.Generator | None = None,
                   window: int = WINDOW) -> torch.Tensor:
    """probs [N, V] (rows sum to 1) -> one token id per row [N], drawn from the renormalised nucleus."""
    if window + 1 >= probs.shape[-1]:  # a small vocabulary: the sort is as cheap as the window
        weights, order = full_nucleus(probs, top_p)
        return order.gather(-1, torch.multinomial(weights, 1, generator=generator)).squeeze(-1)
    weights, ids, exact = windowed_nucleus(probs, top_p, window)
    tokens = ids.gather(-1, torch.multinomial(weights, 1, generator=generator)).squeeze(-1)  # [N]
    if not bool(exact.all()):
        rows = (~exact).nonzero().squeeze(1)  # [F]
        weights, order = full_nucleus(probs[rows], top_p)  # [F, V]
        tokens[rows] = order.gather(-1, torch.multinomial(weights, 1, generator=generator)).squeeze(-1)
    return tokens
