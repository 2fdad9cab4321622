"""grpo-aug's update against TRL 1.16's GRPOTrainer._compute_loss, by value and by gradient.

TRL's formulas are written out below per token on scalars, from its code (trl/trainer/
grpo_trainer.py: the vLLM importance-sampling ratio in _generate_and_score_completions,
get_gamma_weights, the KL with use_bias_correction_kl, the entropy bonus over the entropy mask),
not imported. grpo-aug's side runs through update/chunk_loss.py, the path a training step takes,
on a step whose rows an external engine sampled."""

import math
from typing import NamedTuple

import pytest
import torch

from grpo_aug.algo.aggregate import RowMean, TokenMean
from grpo_aug.algo.engine_correction import SequenceMask, SequenceTruncate, TokenMask, TokenTruncate
from grpo_aug.algo.loss import PolicyObjective, policy_loss
from grpo_aug.algo.objectives import VESPO
from grpo_aug.algo.ratio import SequenceRatio
from grpo_aug.algo.settings import AlgoSettings
from grpo_aug.engines.types import rollout_from_ids
from grpo_aug.update.chunk_loss import chunk_loss

f64 = torch.float64


class Step(NamedTuple):  # the fields of update/step.PreparedStep that chunk_loss reads
    rollout: object
    mask: torch.Tensor
    advantages: torch.Tensor
    ref_logps: torch.Tensor | None
    old_logps: torch.Tensor | None = None
    hinted: torch.Tensor | None = None
    engine_sampled: bool = True


class FixedScorer:
    """The policy's log-probs (and entropies) of the step's tokens, as given: a leaf with gradient."""

    def __init__(self, logps, entropy=None):
        self.logps = torch.tensor(logps, dtype=f64, requires_grad=True)
        self.entropy = None if entropy is None else torch.tensor(entropy, dtype=f64)

    def logprobs(self, policy, part, with_entropy=False, entropy_grad=False):
        return (self.logps, self.entropy) if with_entropy else self.logps


def _step(sampler, mask, adv, ref=None):
    """Rows whose completions have len(mask row) tokens (padding where mask is 0 at the end) and
    whose sampler's log-probs are `sampler`."""
    lengths = [int(sum(m)) for m in mask]
    ids = [[5 + j for j in range(n)] for n in lengths]
    ro = rollout_from_ids([[1, 2]] * len(mask), ids, [s[:n] for s, n in zip(sampler, lengths, strict=True)],
                          torch.ones(len(mask)), [""] * len(mask), [True] * len(mask), 0)
    ro = ro._replace(sample_logprobs=torch.tensor(sampler, dtype=f64))  # float64 as given: exact comparisons
    return Step(ro, torch.tensor(mask, dtype=f64), torch.tensor(adv, dtype=f64),
                None if ref is None else torch.tensor(ref, dtype=f64))


def ours(objective, correction, step, scorer, beta=0.0, aggregate=None, quantile=1.0):
    rows = torch.arange(len(step.advantages))
    loss, stats = chunk_loss(None, scorer, objective, correction, step, rows, beta, aggregate or TokenMean(),
                             top_entropy_quantile=quantile)
    loss.backward()
    return loss.item(), scorer.logps.grad.tolist(), stats


# ---- TRL 1.16, per token ----------------------------------------------------------------------

def trl_is_ratio(old, sampler, mask, mode, cap):
    """_generate_and_score_completions: exp((old - sampler) * mask), per token or summed per row;
    truncate: min(., cap); mask: 0 where > cap. Returns per-token lists (a row's value repeated)."""
    out = []
    for o, s, m in zip(old, sampler, mask, strict=True):
        diffs = [(a - b) * c for a, b, c in zip(o, s, m, strict=True)]
        if mode.startswith("sequence"):
            diffs = [sum(diffs)] * len(diffs)
        ratios = [math.exp(d) for d in diffs]
        out.append([min(r, cap) if mode.endswith("truncate") else (0.0 if r > cap else r) for r in ratios])
    return out


def trl_loss(loss_type, logps, old, adv, mask, is_ratio=None, ref=None, beta=0.0, bias_correction_kl=False,
             level="token", eps=0.2, vespo=(2.0, 3.0, 3.0, 2.0), entropy=None, entropy_mask=None, entropy_coef=0.0):
    """_compute_loss on torch scalars (so that autograd gives TRL's gradient), one generation batch,
    no gradient accumulation: grpo (row mean), vespo (sum over tokens / the batch's loss tokens)."""
    rows, items = [], sum(sum(m) for m in mask)
    total = 0.0
    for i in range(len(logps)):
        T = len(logps[i])
        log_ratio = [logps[i][t] - old[i][t] for t in range(T)]
        if level == "sequence":
            seq = sum(log_ratio[t] * mask[i][t] for t in range(T)) / max(sum(mask[i]), 1.0)
            coef_1 = [torch.exp(seq)] * T
        else:
            coef_1 = [torch.exp(x) for x in log_ratio]
        if loss_type == "vespo":
            k_pos, lam_pos, k_neg, lam_neg = vespo
            seq = sum(max(min(float(x.detach()), 20.0), -20.0) * mask[i][t] for t, x in enumerate(log_ratio))
            if is_ratio is not None:
                seq += sum(min(max(math.log(r) if r > 0 else -math.inf, math.log(1e-8)), 20.0) for r in is_ratio[i])
            log_w = min(max(seq, math.log(1e-8)), 20.0)
            k, lam = (k_pos, lam_pos) if adv[i] >= 0 else (k_neg, lam_neg)
            phi = math.exp(lam + k * log_w - lam * math.exp(log_w))
            per_token = [-phi * adv[i] * logps[i][t] for t in range(T)]
        else:
            per_token = [-torch.minimum(coef_1[t] * adv[i], coef_1[t].clamp(1 - eps, 1 + eps) * adv[i])
                         for t in range(T)]
        if entropy_mask is not None:
            per_token = [per_token[t] * entropy_mask[i][t] for t in range(T)]
        if is_ratio is not None and loss_type != "vespo":
            per_token = [per_token[t] * is_ratio[i][t] for t in range(T)]
        if beta:
            for t in range(T):
                d = ref[i][t] - logps[i][t]
                kl = torch.exp(d) - d - 1
                per_token[t] = per_token[t] + beta * (kl * coef_1[t] if bias_correction_kl else kl)
        masked = sum(per_token[t] * mask[i][t] for t in range(T))
        if loss_type == "vespo":
            total = total + masked / items
        else:
            rows.append(masked / max(sum(mask[i]), 1.0))
    loss = total if loss_type == "vespo" else sum(rows) / len(rows)
    if entropy_coef:
        eff = [[mask[i][t] * (1.0 if entropy_mask is None else entropy_mask[i][t]) for t in range(len(mask[i]))]
               for i in range(len(mask))]
        n = sum(sum(e) for e in eff)
        loss = loss - entropy_coef * sum(entropy[i][t] * eff[i][t] for i in range(len(eff))
                                         for t in range(len(eff[i]))) / max(n, 1.0)
    return loss


def trl_grad(logps, fn):
    leaves = [[torch.tensor(v, dtype=f64, requires_grad=True) for v in row] for row in logps]
    loss = fn(leaves)
    loss.backward()
    return float(loss.detach()), [[x.grad.item() if x.grad is not None else 0.0 for x in row] for row in leaves]


# ---- VESPO on rows an engine sampled ----------------------------------------------------------

def test_vespo_with_an_engine_ratio_the_smallest_case_by_hand():
    """T = 1, log pi = old log pi = -1, the sampler's -1 - ln 2, A = 1: w = pi / pi_sampler = 2,
    phi(2) = e^3 2^2 e^-6 = 4 e^-3, loss -phi A log pi = 4 e^-3 (the issue's 0.199; multiplying
    the row's term by the engine ratio 2 instead would give 2.0)."""
    step = _step([[-1.0 - math.log(2.0)]], [[1.0]], [1.0])
    loss, grad, _ = ours(PolicyObjective(surrogate=VESPO()), TokenTruncate(cap=3.0), step, FixedScorer([[-1.0]]))
    assert loss == pytest.approx(4 * math.exp(-3), rel=1e-12)
    assert grad[0][0] == pytest.approx(-4 * math.exp(-3), rel=1e-12)  # d/dlog pi of -sg(phi) A log pi


LOGPS = [[-1.2, -0.4, -2.0, -0.9], [-0.3, -1.7, -0.8, -3.0], [-2.2, -0.5, -1.1, -0.6]]
OLD = [[-1.0, -0.6, -1.9, -1.0], [-0.2, -1.5, -0.9, -3.0], [-2.0, -0.7, -1.0, -0.5]]
SAMPLER = [[-1.1, -1.9, -1.8, -1.2], [-0.4, -1.2, -1.0, -2.0], [-2.1, -0.6, -0.2, -0.5]]  # row 0 t1: ratio e^1.3
MASK = [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
ADV = [1.3, -0.7, 0.4]
REF = [[-1.5, -0.2, -2.4, -0.7], [-0.6, -1.1, -0.5, -2.0], [-1.8, -0.9, -1.4, -0.3]]


@pytest.mark.parametrize("mode,correction", [("token_truncate", TokenTruncate(cap=3.0)),
                                             ("token_mask", TokenMask(cap=3.0))])
def test_vespo_on_engine_rows_equals_trl_by_value_and_gradient(mode, correction):
    """Two passes over the rollout (old != current), a token over the cap in row 0 (truncated, or
    masked to 0 whose log TRL floors at log 1e-8), padding in rows 1 and 2."""
    step = _step(SAMPLER, MASK, ADV)._replace(old_logps=torch.tensor(OLD, dtype=f64))
    loss, grad, _ = ours(PolicyObjective(surrogate=VESPO()), correction, step, FixedScorer(LOGPS))
    is_ratio = trl_is_ratio(OLD, SAMPLER, MASK, mode, 3.0)
    want, want_grad = trl_grad(LOGPS, lambda lp: trl_loss("vespo", lp, OLD, ADV, MASK, is_ratio=is_ratio))
    assert loss == pytest.approx(want, rel=1e-10)
    assert torch.allclose(torch.tensor(grad), torch.tensor(want_grad), rtol=1e-9, atol=1e-15)
    # the engine ratio matters: without it the loss is another number
    plain = _step(OLD, MASK, ADV)._replace(old_logps=torch.tensor(OLD, dtype=f64))
    other, _, _ = ours(PolicyObjective(surrogate=VESPO()), correction, plain, FixedScorer(LOGPS))
    assert abs(other - loss) > 1e-3


def test_the_clip_on_engine_rows_still_multiplies_each_token_by_the_engine_weight_as_trl():
    step = _step(SAMPLER, MASK, ADV)._replace(old_logps=torch.tensor(OLD, dtype=f64))
    loss, grad, _ = ours(PolicyObjective(), TokenTruncate(cap=3.0), step, FixedScorer(LOGPS), aggregate=RowMean())
    is_ratio = trl_is_ratio(OLD, SAMPLER, MASK, "token_truncate", 3.0)
    want, want_grad = trl_grad(LOGPS, lambda lp: trl_loss("grpo", lp, OLD, ADV, MASK, is_ratio=is_ratio))
    assert loss == pytest.approx(want, rel=1e-10)
    assert torch.allclose(torch.tensor(grad), torch.tensor(want_grad), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("correction", [SequenceMask(cap=3.0), SequenceTruncate(cap=3.0)])
def test_vespo_refuses_a_sequence_level_engine_correction(correction):
    with pytest.raises(ValueError, match="algo/surrogate=vespo folds the engine correction's token weights"):
        AlgoSettings(surrogate=VESPO(), engine_correction=correction)


# ---- the KL weighted by the importance ratio --------------------------------------------------

def test_ratio_weighted_kl_on_policy_has_trls_gradient_by_hand():
    """log pi = old = -1, ref = -2, beta 0.04, A = 0: k3 = e^-1 - (-1) - 1 = e^-1 either way, but
    d/dlog pi of beta k3 is beta (1 - e^-1) = 0.0253, and of beta k3 r (r = 1 with gradient r)
    beta (1 - e^-1 + e^-1) = 0.0400 (TRL's use_bias_correction_kl, its default)."""
    for weighted, want in ((False, 0.04 * (1 - math.exp(-1))), (True, 0.04)):
        step = _step([[-1.0]], [[1.0]], [0.0], ref=[[-2.0]])._replace(engine_sampled=False)
        loss, grad, _ = ours(PolicyObjective(kl_ratio_weighted=weighted), None, step, FixedScorer([[-1.0]]),
                             beta=0.04)
        assert loss == pytest.approx(0.04 * math.exp(-1), rel=1e-12)
        assert grad[0][0] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("weighted", [False, True])
def test_kl_off_policy_equals_trl_by_value_and_gradient(level, weighted):
    step = _step(OLD, MASK, ADV, ref=REF)._replace(old_logps=torch.tensor(OLD, dtype=f64), engine_sampled=False)
    objective = PolicyObjective(kl_ratio_weighted=weighted, **({"ratio": SequenceRatio()} if level == "sequence"
                                                                 else {}))
    loss, grad, _ = ours(objective, None, step, FixedScorer(LOGPS), beta=0.04, aggregate=RowMean())
    want, want_grad = trl_grad(LOGPS, lambda lp: trl_loss("grpo", lp, OLD, ADV, MASK, ref=REF, beta=0.04,
                                                          bias_correction_kl=weighted, level=level))
    assert loss == pytest.approx(want, rel=1e-10)
    assert torch.allclose(torch.tensor(grad), torch.tensor(want_grad), rtol=1e-9, atol=1e-15)


def test_the_kl_option_reaches_the_objective_from_the_settings():
    assert AlgoSettings(kl_ratio_weighted=True).objective.kl_ratio_weighted
    assert not AlgoSettings().objective.kl_ratio_weighted


# ---- the entropy mask and the entropy bonus ---------------------------------------------------

ENT = [[0.9, 0.1, 1.4, 0.3], [0.2, 1.1, 0.6, 5.0], [1.6, 0.05, 9.0, 9.0]]  # padding's values must not count


def test_tokens_outside_the_entropy_mask_get_exactly_no_policy_gradient():
    step = _step(OLD, MASK, ADV)._replace(engine_sampled=False)
    _, grad, stats = ours(PolicyObjective(), None, step, FixedScorer(LOGPS, ENT), quantile=0.5)
    # the top half of the 9 loss tokens' entropies (quantile 0.5 of them is 0.6): 0.9, 1.4, 0.6, 1.1, 1.6
    kept = [[1, 0, 1, 0], [0, 1, 1, 0], [1, 0, 0, 0]]
    for i in range(3):
        for t in range(4):
            if kept[i][t]:
                assert grad[i][t] != 0.0, (i, t)
            else:
                assert grad[i][t] == 0.0, (i, t)
    assert stats.entropy_kept.item() == pytest.approx(5 / 9)


def test_the_entropy_bonus_is_the_mean_over_the_kept_tokens_as_trl():
    step = _step(OLD, MASK, ADV)._replace(old_logps=torch.tensor(OLD, dtype=f64), engine_sampled=False)
    ent = torch.tensor(ENT, dtype=f64, requires_grad=True)  # the bonus's gradient flows into the entropies
    kept = torch.tensor([[1, 0, 1, 0], [0, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    logps = torch.tensor(LOGPS, dtype=f64, requires_grad=True)
    loss, _ = policy_loss(logps, None, step.old_logps, step.advantages, step.mask, beta=0.0, aggregate=RowMean(),
                          entropy=ent, entropy_coef=0.01, kept=kept)
    want = trl_loss("grpo", [[torch.tensor(v, dtype=f64) for v in r] for r in LOGPS], OLD, ADV, MASK,
                    entropy=ENT, entropy_mask=kept.double().tolist(), entropy_coef=0.01)
    assert loss.item() == pytest.approx(float(want), rel=1e-12)
    loss.backward()  # d loss / d H = -coef / 5 on the 5 kept tokens, 0 elsewhere
    assert torch.allclose(ent.grad, -0.01 / 5 * kept.double(), rtol=0, atol=1e-15)


def test_chunks_bonuses_add_up_to_the_token_weighted_mean():
    """The update's rows split in two chunks, each with its share of the update's loss tokens."""
    ent = torch.tensor(ENT, dtype=f64)
    mask = torch.tensor(MASK, dtype=f64)
    zero = torch.zeros(3, 4, dtype=f64)
    parts = []
    for rows in ([0], [1, 2]):
        share = mask[rows].sum() / mask.sum()
        loss, _ = policy_loss(zero[rows], None, zero[rows], torch.zeros(len(rows), dtype=f64), mask[rows], beta=0.0,
                              entropy=ent[rows], entropy_coef=1.0, bonus_share=share)
        parts.append(loss.item())
    by_hand = -(0.9 + 0.1 + 1.4 + 0.3 + 0.2 + 1.1 + 0.6 + 1.6 + 0.05) / 9
    assert sum(parts) == pytest.approx(by_hand, rel=1e-12)


def test_cispo_logs_the_capped_share_of_positive_advantage_tokens_as_trl():
    """ratios pi / pi_old over the cap 1.1 (log > 0.0953): row 0 tokens 1 and 3 (A 1.3), row 1 token 2
    (A -0.7, not counted by TRL's cispo_clip_ratio), row 2 token 1 (A 0.4): 3 of the 9 loss tokens."""
    from grpo_aug.algo.objectives import CISPO

    _, stats = policy_loss(torch.tensor(LOGPS, dtype=f64), None, torch.tensor(OLD, dtype=f64),
                           torch.tensor(ADV, dtype=f64), torch.tensor(MASK, dtype=f64), beta=0.0,
                           aggregate=TokenMean(), surrogate=CISPO(max_ratio=1.1))
    assert stats.clip_frac_high.item() == pytest.approx(3 / 9)
