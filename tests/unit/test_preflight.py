import random

import pytest
import torch

from grpo_aug.data.records import Prompt
from grpo_aug.preflight import (
    PreflightSettings,
    Samples,
    bucket_breakdown,
    cut_before_answer,
    discrimination,
    pair_auc,
    run_checks,
    shuffled_steps,
    table,
    tool_use,
    wrong_final,
)
from grpo_aug.rewards import MathReward, RewardFunction, RewardSet, SoftMathReward

SOLUTION = "<<47+38=85>>85\n<<85-9=76>>76\n#### 76"


def test_corruptions_by_hand():
    assert wrong_final(SOLUTION) == "<<47+38=85>>85\n<<85-9=76>>76\n#### 77"
    assert wrong_final("x\n#### 2.5") == "x\n#### 3.5"
    assert wrong_final("no answer line") is None
    assert shuffled_steps(SOLUTION, random.Random(0)) == "<<85-9=76>>76\n<<47+38=85>>85\n#### 76"
    assert shuffled_steps("<<47+8=55>>55\n#### 55", random.Random(0)) is None  # one step: nothing to shuffle
    assert cut_before_answer(SOLUTION, "76") == "<<47+38=85>>85\n<<85-9="
    assert cut_before_answer("76 first", "76") is None


def test_auc_by_hand_with_two_rewards():
    prompts = [Prompt("a", "What is 47 + 38 - 9?", "p", "76", SOLUTION, "medium"),
               Prompt("b", "What is 47 + 8?", "p", "55", "<<47+8=55>>55\n#### 55", "easy")]
    assert pair_auc(1.0, [0.0, 1.0, 2.0]) == [1.0, 0.5, 0.0]
    exact = discrimination(RewardSet([RewardFunction(MathReward())]), prompts, seed=0)
    # exact answer: wrong final 2/2 below, cut (last number 9, resp. 8) 2/2 below, shuffle a tie (0.5)
    assert exact == {"wrong final number": 1.0, "steps out of order": 0.5, "cut before the answer": 1.0,
                     "all": pytest.approx(4.5 / 5)}
    soft = discrimination(RewardSet([RewardFunction(SoftMathReward())]), prompts, seed=0)
    assert soft["steps out of order"] == 1.0 and soft["all"] == 1.0  # 0.8 for using 85 before computing it
    # an answer-only reward is not judged on step order: "all" covers the other four pairs
    answer_only = discrimination(RewardSet([RewardFunction(MathReward())]), prompts, seed=0, judge_steps=False)
    assert answer_only == {**exact, "all": 1.0}


def test_checks_pass_and_fail_on_constructed_samples():
    s = PreflightSettings()
    mixed = torch.tensor([[1.0, 0.0, 0.0, 1.0]] * 3 + [[0.0] * 4])  # 3 of 4 groups with spread
    lengths = torch.full((16,), 10.0)
    every = torch.ones(4, 4, dtype=torch.bool)
    ok = run_checks(Samples(mixed, every, lengths, torch.zeros(16, dtype=torch.bool), []),
                    {"all": 0.95, "wrong final number": 0.95}, s)
    assert [c.passed for c in ok] == [True, True, True]
    flat = torch.zeros(4, 4)
    polar = torch.tensor([1.0] * 8 + [32.0] * 8)
    bad = run_checks(Samples(flat, every, polar, torch.ones(16, dtype=torch.bool), []), {"all": 0.5}, s)
    assert [c.passed for c in bad] == [False, False, False]
    assert "median within-group std 0.000" in bad[0].numbers and "truncated 1.00" in bad[1].numbers
    text = table(bad)
    assert "FAIL" in text and "reward discriminates quality" in text


def test_unscorable_rows_are_not_counted_as_zero_rewards():
    s = PreflightSettings()
    # each group: two correct rows and two unscorable ones (reward 0 stored, not counted): flat
    rewards = torch.tensor([[1.0, 1.0, 0.0, 0.0]] * 4)
    counted = torch.tensor([[True, True, False, False]] * 4)
    lengths, truncated = torch.full((16,), 10.0), torch.zeros(16, dtype=torch.bool)
    checks = run_checks(Samples(rewards, counted, lengths, truncated, []), {"all": 1.0}, s)
    assert not checks[0].passed and "median within-group std 0.000" in checks[0].numbers
    assert "zero-std groups 1.00" in checks[0].numbers


def test_bad_preflight_settings():
    with pytest.raises(ValueError, match="preflight.min_auc"):
        PreflightSettings(min_auc=1.5)
    with pytest.raises(ValueError, match="preflight.batches"):
        PreflightSettings(batches=0)


def test_bucket_breakdown_by_hand():
    def prompt(bucket):
        return Prompt("x", "q", "p", "1", "<<0+1=1>>1\n#### 1", bucket)

    rewards = torch.tensor([[1.0, 1.0, 0.0, 0.0],   # easy, spread, mean 0.5
                            [1.0, 1.0, 1.0, 1.0],   # easy, flat, mean 1
                            [0.0, 0.0, 0.0, 0.0],   # hard, flat
                            [1.0, 0.0, 0.0, 0.0]])  # hard, but one counted row: no std, left out
    counted = torch.ones(4, 4, dtype=torch.bool)
    counted[3, 1:] = False
    samples = Samples(rewards, counted, torch.full((16,), 5.0), torch.zeros(16, dtype=torch.bool),
                      [prompt("easy"), prompt("easy"), prompt("hard"), prompt("hard")])
    assert bucket_breakdown(samples) == ("zero-std share by bucket: easy 0.50 of 2 groups, mean reward 0.75; "
                                         "hard 1.00 of 1 groups, mean reward 0.00")


def test_tool_use_line_counts_rows_calls_failures_and_tool_tokens():
    # 4 rows: 2 calls (1 failed), none, 1 call, 3 calls; tool tokens 6, 0, 3, 9
    samples = Samples(torch.zeros(1, 4), torch.ones(1, 4, dtype=torch.bool), torch.full((4,), 5.0),
                      torch.zeros(4, dtype=torch.bool), [],
                      (torch.tensor([2, 0, 1, 3]), torch.tensor([1, 0, 0, 0]), torch.tensor([6, 0, 3, 9])))
    assert tool_use(samples, "calculator") == ("tool use (calculator): 0.75 of rows call, 1.50 calls per row, "
                                               "1 of 6 calls failed, 18 tool tokens (no loss)")
