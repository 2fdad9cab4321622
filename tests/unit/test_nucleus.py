"""The sort-free nucleus against the sort it replaces (engines/nucleus.py): the same kept tokens,
draws that follow the sort's renormalised distribution, flat rows whose nucleus spans thousands of
tokens included."""

import torch

from grpo_aug.engines.nucleus import SORT_UP_TO, draw, in_nucleus, sample_nucleus, sorted_nucleus


def reference_nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Written out per row: walk the tokens in descending order, keep each while the mass before it
    is < top_p; dense [N, V] float64, renormalised."""
    out = torch.zeros_like(probs, dtype=torch.float64)
    for r, row in enumerate(probs.double()):
        before = 0.0
        for i in row.argsort(descending=True).tolist():
            if before >= top_p:
                break
            out[r, i] = row[i]
            before += float(row[i])
    return out / out.sum(-1, keepdim=True)


def rows(scale: float, n: int = 6, vocab: int = 3000, seed: int = 0) -> torch.Tensor:
    return torch.softmax(torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * scale, -1)


def test_membership_is_the_sorts_kept_set_on_peaked_and_flat_rows():
    for scale in (0.5, 2.0, 6.0):  # 0.5: nearly uniform, the nucleus spans most of the vocabulary
        probs = rows(scale)
        for top_p in (0.3, 0.9, 0.95):
            want = reference_nucleus(probs, top_p) > 0  # [N, V]
            every = torch.arange(probs.shape[1]).repeat(probs.shape[0])  # each token of each row
            got = in_nucleus(probs.repeat_interleave(probs.shape[1], 0), every, top_p).view_as(want)
            assert torch.equal(got, want), (scale, top_p)
    assert int((reference_nucleus(rows(0.5), 0.95) > 0).sum(-1).min()) > 1024  # the flat case is really flat


def test_draws_follow_the_sorts_renormalised_nucleus():
    top_p, draws = 0.8, 40000
    for scale in (0.5, 4.0):
        probs = rows(scale, n=1, vocab=2000, seed=3).expand(draws, -1).contiguous()
        tokens = sample_nucleus(probs, top_p, torch.Generator().manual_seed(1))
        want = reference_nucleus(probs[:1], top_p)[0]
        assert bool((want[tokens] > 0).all()), "a token outside the nucleus was drawn"
        freq = torch.bincount(tokens, minlength=2000).double() / draws
        # every token's frequency within 5 standard errors of its renormalised probability
        se = (want * (1 - want) / draws).sqrt()
        assert bool(((freq - want).abs() <= 5 * se + 2e-4).all()), scale
        # and as a whole: Pearson's chi-square over the kept tokens within 5 sigma of its K - 1 degrees of freedom
        kept = want > 0
        expected = want[kept] * draws
        chi2 = float((((freq[kept] * draws) - expected) ** 2 / expected).sum())
        dof = int(kept.sum()) - 1
        assert chi2 < dof + 5 * (2 * dof) ** 0.5, (scale, chi2, dof)


def test_the_most_likely_token_is_kept_even_when_top_p_is_tiny():
    probs = rows(1.0, n=8, vocab=2000)
    tokens = sample_nucleus(probs, 1e-6, torch.Generator().manual_seed(0))
    assert torch.equal(tokens, probs.argmax(-1))


def test_inverse_cdf_draw_never_picks_a_zero_weight():
    weights = torch.zeros(4, 5000)
    weights[:, [0, 4999]] = torch.tensor([0.25, 0.75])
    picks = torch.stack([draw(weights, torch.Generator().manual_seed(s)) for s in range(500)])
    assert set(picks.unique().tolist()) == {0, 4999}
    share = float((picks == 4999).double().mean())
    assert abs(share - 0.75) < 0.05


def test_a_small_vocabulary_keeps_the_sort_and_its_random_stream():
    probs = torch.softmax(torch.randn(8, SORT_UP_TO, generator=torch.Generator().manual_seed(5)), -1)
    got = sample_nucleus(probs, 0.9, torch.Generator().manual_seed(9))
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    sorted_probs = sorted_probs.masked_fill(sorted_probs.cumsum(-1) - sorted_probs >= 0.9, 0.0)
    want = order.gather(-1, torch.multinomial(sorted_probs, 1, generator=torch.Generator().manual_seed(9))).squeeze(-1)
    assert torch.equal(got, want)
    assert torch.equal(sorted_nucleus(probs, 0.9, torch.Generator().manual_seed(9)), want)


def test_a_token_whose_mass_above_equals_top_p_is_out_as_in_the_sort():
    probs = torch.zeros(1, 2000)
    probs[0, :4] = torch.tensor([0.5, 0.25, 0.125, 0.125])  # exact in binary: the third has 0.75 above it
    assert in_nucleus(probs.expand(3, -1), torch.tensor([0, 1, 2]), 0.75).tolist() == [True, True, False]
    assert (reference_nucleus(probs, 0.75)[0, :3] > 0).tolist() == [True, True, False]
