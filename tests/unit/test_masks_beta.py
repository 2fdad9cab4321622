import re

import pytest
import torch

from grpo_aug.algo.advantages import NoScale, group_advantages
from grpo_aug.algo.beta import ConstantBeta, LinearBeta, RelaxBeta
from grpo_aug.algo.masks import repetition_mask, template_mask, truncation_mask
from grpo_aug.rewards.overlong import overlong_penalty


def test_truncation_mask_zeroes_rows_without_eos():
    cm = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 1, 1]])
    out = truncation_mask(cm, torch.tensor([True, False, False]))
    assert out.tolist() == [[0, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_overlong_penalty_by_hand():
    # budget 10, buffer 4: free up to 6 tokens, then -1/4 per token down to -1 at 10
    lengths = torch.tensor([3, 6, 7, 8, 10])
    assert overlong_penalty(lengths, 10, 4).tolist() == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert overlong_penalty(lengths, 10, 4, penalty=0.5).tolist() == [0.0, 0.0, -0.125, -0.25, -0.5]
    assert overlong_penalty(lengths, 10, 0).tolist() == [0.0] * 5


def test_template_mask_on_hand_made_tokens():
    pieces = ["<think>", "I", " add", "</think>", " 4", "+", "5", "=", "9", ""]
    keep = template_mask(pieces, [re.compile(r"</?think>")])
    assert keep == [0, 1, 1, 0, 1, 1, 1, 1, 1, 1]
    # a match that covers part of a token masks the whole token; the EOS piece "" is never covered
    keep2 = template_mask(["Ans", "wer:", " 9", ""], [re.compile(r"^Answer: ?")])
    assert keep2 == [0, 0, 0, 1]  # "Answer: " reaches into " 9"
    assert template_mask(["a", "b"], []) == [1, 1]


def test_repetition_mask_on_hand_made_tokens():
    ids = [7, 1, 2, 1, 2, 1, 2, 9]  # bigram (1, 2) occurs 3 times, (2, 1) twice
    assert repetition_mask(ids, ngram=2, max_repeats=2) == [1, 0, 0, 0, 0, 0, 0, 1]
    assert repetition_mask(ids, ngram=2, max_repeats=3) == [1] * 8
    assert repetition_mask(ids, ngram=0, max_repeats=1) == [1] * 8
    assert repetition_mask([1, 2], ngram=3, max_repeats=1) == [1, 1]


def test_no_scale_keeps_centred_rewards():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    assert group_advantages(r, scale=NoScale()).tolist() == [[0.75, -0.25, -0.25, -0.25]]
    std = ((0.75**2 + 3 * 0.25**2) / 3) ** 0.5  # unbiased std of {1, 0, 0, 0} = 0.5
    assert group_advantages(r)[0, 0].item() == pytest.approx(0.75 / std, rel=1e-5)


def test_beta_schedules_at_chosen_steps():
    assert [ConstantBeta(0.04)(s) for s in (0, 10**6)] == [0.04, 0.04]
    lin = LinearBeta(start=0.04, end=0.0, steps=100)
    assert [lin(s) for s in (0, 25, 50, 100, 500)] == pytest.approx([0.04, 0.03, 0.02, 0.0, 0.0])

    by_step = RelaxBeta(value=0.04, factor=0.5, kl_below=0.01, patience=3, after_step=200)
    assert (by_step(199), by_step(200)) == (0.04, 0.02)

    relax = RelaxBeta(value=0.04, factor=0.25, kl_below=0.01, patience=3)
    for step, kl in enumerate([0.005, 0.005, 0.02, 0.005, 0.005]):  # the spike resets the count
        relax.observe(step, kl)
    assert relax(5) == 0.04
    state = relax.state_dict()
    relax.observe(5, 0.001)
    assert relax(6) == pytest.approx(0.01)  # three calm rollouts in a row: 0.04 x 0.25
    relax.observe(6, 1.0)
    assert relax(7) == pytest.approx(0.01)  # relaxing is for good
    resumed = RelaxBeta(value=0.04, factor=0.25, kl_below=0.01, patience=3)
    resumed.load_state_dict(state)
    resumed.observe(5, 0.001)
    assert resumed(6) == pytest.approx(0.01)


def test_beta_schedules_reject_bad_values():
    with pytest.raises(ValueError, match="algo.beta.value"):
        ConstantBeta(-1)
    with pytest.raises(ValueError, match="algo.beta.factor"):
        RelaxBeta(factor=2)
    with pytest.raises(ValueError, match="algo.beta.steps"):
        LinearBeta(steps=0)
