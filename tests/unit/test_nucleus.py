"""The windowed nucleus against the full sort it replaces: the same kept tokens with the same
renormalised probabilities, the fallback where the window cannot decide, the same draws."""

import torch

from grpo_aug.engines.nucleus import full_nucleus, sample_nucleus, windowed_nucleus


def sorted_nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The reference, written out per row: walk the tokens in descending order, keep each while the
    mass before it is < top_p; dense [N, V] renormalised."""
    out = torch.zeros_like(probs, dtype=torch.float64)
    for r, row in enumerate(probs.double()):
        before = 0.0
        for i in row.argsort(descending=True).tolist():
            if before >= top_p:
                break
            out[r, i] = row[i]
            before += float(row[i])
    return out / out.sum(-1, keepdim=True)


def dense(weights: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    out = torch.zeros(weights.shape[0], vocab, dtype=torch.float64).scatter_(1, ids, weights.double())
    return out / out.sum(-1, keepdim=True)


def test_window_keeps_the_sorts_nucleus_on_random_logits():
    gen = torch.Generator().manual_seed(0)
    vocab = 5000
    for scale in (1.0, 3.0, 8.0):  # flatter to peakier rows
        probs = torch.softmax(torch.randn(16, vocab, generator=gen) * scale, -1)
        for top_p in (0.5, 0.9, 0.95):
            weights, ids, exact = windowed_nucleus(probs, top_p, window=256)
            want = sorted_nucleus(probs, top_p)
            got = dense(weights, ids, vocab)
            rows = exact.nonzero().squeeze(1)
            assert torch.allclose(got[rows], want[rows], atol=1e-6)
            # a row the window cannot decide is exactly one whose nucleus needs more than 256 tokens
            sizes = (want > 0).sum(-1)
            assert torch.equal(~exact, sizes > 256), (scale, top_p, sizes)


def test_nucleus_spilling_past_the_window_falls_back_to_the_sort():
    probs = torch.full((2, 3000), 1 / 3000)  # uniform: every token is needed for 0.9
    probs[1] = torch.softmax(torch.arange(3000.0, 0, -1) * 0.05, -1)  # peaked: a short nucleus
    _, _, exact = windowed_nucleus(probs, 0.9, window=64)
    assert exact.tolist() == [False, True]
    draws = torch.stack([sample_nucleus(probs, 0.9, torch.Generator().manual_seed(s), window=64) for s in range(400)])
    assert int(draws[:, 0].max()) >= 64  # the uniform row drew beyond the window: it was sampled from the sort
    want = sorted_nucleus(probs, 0.9)
    assert bool((want[0, draws[:, 0]] > 0).all()) and bool((want[1, draws[:, 1]] > 0).all())


def test_a_tie_on_the_windows_edge_falls_back_and_a_tie_of_zeros_does_not():
    probs = torch.zeros(2, 100)
    probs[0, :20] = 0.05  # 20 equal tokens: the 8-token window's edge ties with token 9
    probs[1, :5] = torch.tensor([0.4, 0.3, 0.2, 0.05, 0.05])  # the rest are zeros tied at 0
    _, _, exact = windowed_nucleus(probs, 0.3, window=8)
    assert exact.tolist() == [False, True]


def test_draws_follow_the_same_distribution_as_the_sorts():
    gen = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(1, 4000, generator=gen) * 4, -1).expand(40000, -1).contiguous()
    top_p = 0.8
    tokens = sample_nucleus(probs, top_p, torch.Generator().manual_seed(1), window=128)
    weights, order = full_nucleus(probs[:1], top_p)
    want = torch.zeros(4000, dtype=torch.float64).scatter_(0, order[0], weights[0].double())
    want /= want.sum()
    freq = torch.bincount(tokens, minlength=4000).double() / len(tokens)
    assert set(tokens.unique().tolist()) <= set(want.nonzero().squeeze(1).tolist())
    kept = want > 0
    # each kept token's frequency within 5 standard errors of its probability
    se = (want[kept] * (1 - want[kept]) / len(tokens)).sqrt()
    assert bool(((freq[kept] - want[kept]).abs() <= 5 * se + 1e-4).all())


def test_a_small_vocabulary_takes_the_sort_and_draws_what_it_drew():
    gen = torch.Generator().manual_seed(5)
    probs = torch.softmax(torch.randn(8, 300, generator=gen), -1)
    got = sample_nucleus(probs, 0.9, torch.Generator().manual_seed(9))
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    sorted_probs = sorted_probs.masked_fill(sorted_probs.cumsum(-1) - sorted_probs >= 0.9, 0.0)
    want = order.gather(-1, torch.multinomial(sorted_probs, 1, generator=torch.Generator().manual_seed(9))).squeeze(-1)
    assert torch.equal(got, want)
