"""Hostile completions: nothing escapes the rewards or the evaluator, and no call is slow."""

import time

import pytest

from grpo_aug.data.records import Prompt
from grpo_aug.mathtext import NotArithmetic, evaluate, matches, to_fraction
from grpo_aug.rewards import RewardFunction, RewardSet, SoftMathReward, fuzz

BUDGET_S = 0.05  # per call, for any completion up to 32k characters


@pytest.mark.parametrize("text", [
    "<<1e999=5>>", "<<1+1=1e999999999>>", "<<1+1=-1e-999999999>>", "#### 1e999999999", "<<2=1/0>>",
    "<<" + "(" * 500 + "1" + ")" * 500 + "=1>>", "<<48/2=24>>" * 2000, "A: " + ",".join(["1"] * 3000),
    "<<١٢+٣=١٥>>", "The answer is nan", "\\boxed{" * 3000, " + ".join(["123456789"] * 3000) + " = 5",
])
def test_issue_inputs_return_a_score_fast(text):
    reward = SoftMathReward()
    start = time.thread_time()
    assert reward(fuzz.PROMPT, text) in (0.0, 0.3, 0.8, 1.0)
    assert time.thread_time() - start < BUDGET_S


def test_evaluator_raises_only_not_arithmetic():
    for text in ["1e999", "9" * 199, "1/0", "((((1))))" * 20, "2(3)", "1 if 1 else 2", "__import__('os')", "1j", "inf",
                 "1" + "+1" * 99, "\x00", "٣+٣", "0x1F", "1_000", ""]:
        with pytest.raises(NotArithmetic):
            evaluate(text)
    assert evaluate("48/2+3*(4-1)") == 33 and evaluate("1,000 + 50%") == 1000.5
    # numbers are bounded before they become exact fractions
    for text in ["1e999999999", "1" * 65, "nan", "-inf", "1/0", "١٢"]:
        with pytest.raises(NotArithmetic):
            to_fraction(text)
    assert to_fraction("1.5e3") == 1500 and to_fraction("-3/4") * 4 == -3
    assert not matches(evaluate("1+1"), "1e999999999") and matches(evaluate("10/3"), "3.33")


def test_fuzz_subset_nothing_escapes_and_every_call_is_within_budget():
    # every kind of hostile case comes up in 3,000; the slow suite feeds 100,000
    report = fuzz.run(fuzz.cases(3_000, seed=0))
    assert report.calls == 3_000 * len(fuzz.targets())
    assert report.escapes == []
    slow = {name: (round(s * 1000, 1), text) for name, (s, text) in report.slowest.items() if s > BUDGET_S}
    assert slow == {}


@pytest.mark.slow
def test_fuzz_full_run():
    report = fuzz.run(fuzz.cases(100_000, seed=1))
    assert report.escapes == []
    assert all(s <= BUDGET_S for s, _ in report.slowest.values()), report.slowest


def _hangs(prompt, completion):
    if "hang" in completion:
        while True:
            pass
    if "raise" in completion:
        raise KeyError("boom")
    return float(len(completion))


def test_timeout_makes_the_row_unscorable_and_the_run_goes_on():
    prompt = Prompt("p1", "q", "Q: q\nA: ", "1", "#### 1", "easy")
    rewards = RewardSet([RewardFunction(_hangs, name="user")], on_error="skip", timeout_s=0.5)
    try:
        start = time.monotonic()
        scores = rewards.score([prompt], [["ab", "hang", "abc", "raise"]])
        assert time.monotonic() - start < 5
        assert scores.timeouts == {"user": 1} and scores.errors == {"user": 1}
        assert scores.scored.tolist() == [[True, False, True, False]]
        assert scores.total.tolist() == [[2.0, 0.0, 3.0, 0.0]]
        # the child was replaced: later calls still work
        assert rewards.score([prompt], [["abcd"]]).total.tolist() == [[4.0]]
    finally:
        rewards.timed.close()
    raising = RewardSet([RewardFunction(_hangs, name="user")], timeout_s=0.5)
    with pytest.raises(RuntimeError, match=r"reward function 'user' raised on prompt 'p1': KeyError\('boom'\)"):
        raising.score([prompt], [["raise"]])
    raising.timed.close()
    with pytest.raises(ValueError, match="reward.timeout_s"):
        RewardSet([RewardFunction(_hangs)], timeout_s=0)
