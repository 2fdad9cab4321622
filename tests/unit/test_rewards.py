"""Every reward function on hand-written completions, and how the reward set combines them."""

import math

import pytest
import torch

from grpo_aug.algo.winsorize import NoWinsorize, Winsorize
from grpo_aug.answers import AnswerFormat
from grpo_aug.data.records import Prompt
from grpo_aug.errors import UsageError
from grpo_aug.rewards import (
    FormatReward,
    MathReward,
    RepetitionReward,
    RewardFunction,
    RewardSet,
    ScriptReward,
    SimilarityReward,
    SoftMathReward,
)

# a GSM8K-style reference: 48/2 = 24 is the intermediate, 48 + 24 = 72 the answer
GSM = Prompt(
    id="gsm-1",
    question="Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
             "How many clips did Natalia sell altogether in April and May?",
    prompt="Q: ...\nA: ",
    answer="72",
    solution="Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72",
    bucket="easy",
)


@pytest.mark.parametrize(
    "completion, tier",
    [
        ("In May 48/2 = 24. Total 48+24 = 72.\n#### 72", 1.0),  # right answer, right steps, concise
        ("<<48/2=24>>24 then <<48+24=72>>72\n#### 72", 1.0),
        ("#### 72", 1.0),  # nothing to check is not a flaw
        ("In May 48/2 = 25. Total 48+24 = 72.\n#### 72", 0.8),  # a wrong step, right answer
        ("<<48/2=24>>24 <<48+24=71>>72\n#### 72", 0.8),
        ("Total 48+24 = 72. In May 48/2 = 24.\n#### 72", 0.8),  # 24 used before it is computed
        ("In May 48/2 = 24. " + "So many clips. " * 20 + "\n#### 72", 0.8),  # > 2x the reference length
        ("In May 48/2 = 24. Total 48+24 = 70.\n#### 70", 0.3),  # 24 reached correctly, answer wrong
        ("In May 48/2 = 25. Total 48+25 = 73.\n#### 73", 0.0),  # no reference intermediate computed right
        ("She sold 24 clips in May.\n#### 70", 0.0),  # 24 is stated, not computed
        ("In April 48-0 = 48.\n#### 48", 0.0),  # 48 is a question number, not a step result
        ("", 0.0),
    ],
)
def test_soft_math_tiers(completion, tier):
    assert SoftMathReward()(GSM, completion) == tier


def test_soft_math_tier_values_and_length_limit_are_configurable():
    reward = SoftMathReward(correct=5, flawed=4, partial=2, wrong=-1, max_length_ratio=0.1)
    assert reward(GSM, "In May 48/2 = 24. Total 48+24 = 72.\n#### 72") == 4  # now too long
    assert reward(GSM, "48/2 = 24\n#### 70") == 2
    assert reward(GSM, "#### 1") == -1


# a synthetic medium problem: 31 is the intermediate, 38 the answer; the question gives 33, 2 and 7
MEDIUM = Prompt(id="synthetic-medium-1", question="What is 33 - 2 + 7?", prompt="What is 33 - 2 + 7?", answer="38",
                solution="<<33-2=31>>31\n<<31+7=38>>38\n#### 38", bucket="medium")
FREE_TEXT = AnswerFormat(markers=["hash", "boxed", "answer_is", "equals"], fallback_last_number=True)


@pytest.mark.parametrize(
    "completion, default, uses_all",
    [
        ("33 - 2 = 31\n31 + 7 = 38\nThe answer is 38.", 1.0, 1.0),
        ("33 - 2 = 31\n31 + 7 = 37\nThe answer is 37.", 0.3, 0.3),  # 31 right, every number used
        ("33 - 2 = 31\nThe answer is 31.", 0.3, 0.0),  # stops a line early: 7 is never used
        ("33 - 2 = 31\n33 - 2 = 31\nThe answer is 31.", 0.3, 0.0),  # the line twice still leaves 7 out
        ("33 - 2 = 31\n2 + 7 = 9\nThe answer is 9.", 0.3, 0.3),  # 7 used in a step, if not the right one
        ("33 - 2 + 7 = 37\nThe answer is 37.", 0.0, 0.0),  # every number, but 31 is never computed
        ("33 - 2 = 30\n30 + 7 = 37\nThe answer is 37.", 0.0, 0.0),
        ("The answer is 31.", 0.0, 0.0),  # 31 stated, not computed
    ],
)
def test_soft_math_partial_can_require_every_number_of_the_question(completion, default, uses_all):
    assert SoftMathReward(answer=FREE_TEXT)(MEDIUM, completion) == default
    assert SoftMathReward(partial_uses_all_numbers=True, answer=FREE_TEXT)(MEDIUM, completion) == uses_all


def test_soft_math_partial_uses_all_numbers_must_be_a_bool():
    with pytest.raises(UsageError, match="partial_uses_all_numbers.*'yes'"):
        SoftMathReward(partial_uses_all_numbers="yes")


def test_similarity_is_one_minus_normalised_edit_distance():
    p = Prompt("s", "q", "p", "1", "kitten", "easy")
    assert SimilarityReward()(p, "sitting") == pytest.approx(1 - 3 / 7)  # 3 edits, longer string 7
    assert SimilarityReward()(p, "kitten") == 1.0
    assert SimilarityReward()(p, "") == 0.0


def test_format_repetition_and_script():
    assert FormatReward()(GSM, "work\n#### 72") == 1.0
    assert FormatReward()(GSM, "the answer is 72") == 0.0
    assert FormatReward(pattern=r"\\boxed\{")(GSM, "so \\boxed{72}") == 1.0
    assert RepetitionReward(ngram=3)(GSM, "a b c a b c a b c") == pytest.approx(3 / 7)  # 7 trigrams, 3 distinct
    assert RepetitionReward(ngram=3)(GSM, "one two") == 1.0
    assert ScriptReward("latin")(GSM, "abc д 123 !") == pytest.approx(3 / 4)  # digits/punct are neutral
    assert ScriptReward("han")(GSM, "答案 is") == pytest.approx(2 / 4)
    assert ScriptReward("latin")(GSM, "= 72") == 1.0
    with pytest.raises(ValueError, match="klingon"):
        ScriptReward("klingon")
    with pytest.raises(ValueError, match="not a valid regex"):
        FormatReward(pattern="(")


class Scripted:
    """Returns the values given per completion text; raises where the value is an exception."""

    def __init__(self, name, table):
        self.name, self.table = name, table

    def __call__(self, prompt, completion):
        value = self.table[completion]
        if isinstance(value, Exception):
            raise value
        return value


def test_reward_set_weights_none_filters_and_errors():
    a = Scripted("a", {"x": 1.0, "y": 0.0, "z": None, "w": 1.0})
    b = Scripted("b", {"x": 0.5, "y": 0.25, "z": 1.0, "w": ValueError("boom")})
    gate = Scripted("gate", {"x": 1.0, "y": 0.2, "z": 1.0, "w": 1.0})
    rs = RewardSet([RewardFunction(a, 1.0), RewardFunction(b, 2.0), RewardFunction(gate, 0.0, min_score=0.5)],
                   on_error="skip")
    s = rs.score([GSM], [["x", "y", "z", "w"]])
    assert s.total.tolist() == [[2.0, 0.5, 0.0, 0.0]]  # 1 + 2*0.5, 0 + 2*0.25; z, w unscorable
    assert s.scored.tolist() == [[True, True, False, False]]
    assert s.kept.tolist() == [[True, False, False, False]]  # y is filtered out by the gate
    assert s.errors == {"a": 0, "b": 1, "gate": 0}
    assert math.isnan(s.parts["a"][0, 2]) and math.isnan(s.parts["b"][0, 3])
    with pytest.raises(RuntimeError, match="reward function 'b' raised on prompt 'gsm-1'"):
        RewardSet([RewardFunction(b)]).score([GSM], [["w"]])


def test_reward_set_rejects_bad_returns_and_bad_config():
    with pytest.raises(TypeError, match="returned 'high'"):
        RewardSet([RewardFunction(Scripted("s", {"x": "high"}))]).score([GSM], [["x"]])
    with pytest.raises(TypeError, match="returned nan"):
        RewardSet([RewardFunction(Scripted("s", {"x": math.nan}))]).score([GSM], [["x"]])
    with pytest.raises(ValueError, match=r"reward.functions\[1\].weight"):
        RewardSet([RewardFunction(MathReward()), RewardFunction(SoftMathReward(), -0.5)])
    with pytest.raises(ValueError, match="used twice"):
        RewardSet([RewardFunction(MathReward()), RewardFunction(MathReward())])
    with pytest.raises(ValueError, match="reward.on_error"):
        RewardSet([RewardFunction(MathReward())], on_error="zero")


def test_winsorize_against_hand_computed_quantiles():
    rewards = torch.tensor([[0.0, 10.0, 20.0, 30.0, 100.0]])
    valid = torch.ones_like(rewards, dtype=torch.bool)
    # linear interpolation over 5 sorted values: q=0.9 sits at position 3.6 -> 30 + 0.6 * 70 = 72;
    # q=0.1 at position 0.4 -> 0 + 0.4 * 10 = 4
    out = Winsorize(lower=0.1, upper=0.9)(rewards, valid)
    assert torch.allclose(out, torch.tensor([[4.0, 10.0, 20.0, 30.0, 72.0]]))
    # invalid rows do not shape the quantiles: over {0, 10, 20} q=0.5 is 10
    valid2 = torch.tensor([[True, True, True, False, False]])
    out2 = Winsorize(lower=0.0, upper=0.5)(rewards, valid2)
    assert out2.tolist() == [[0.0, 10.0, 10.0, 10.0, 10.0]]
    assert torch.equal(NoWinsorize()(rewards, valid), rewards)
    with pytest.raises(ValueError, match="lower=0.9, upper=0.1"):
        Winsorize(lower=0.9, upper=0.1)
