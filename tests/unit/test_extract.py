from fractions import Fraction

import pytest

from grpo_aug.data.records import Prompt
from grpo_aug.rewards import MathReward, extract_answer, to_number


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<<48/2=24>>24 clips\n<<48+24=72>>72\n#### 72", "72"),
        ("so the total is \\boxed{1,234}", "1234"),
        ("The answer is $18.00.", "18"),
        ("the final answer is: 50%", "50"),
        ("Q: what\nA: 3/4", "3/4"),
        ("I think 5 then 7 then 12.50", "12.5"),
        ("#### 7 but later 9", "7"),
        ("#### -3", "-3"),
        ("no digits here", None),
        ("The answer is 4. #### 5", "5"),
        ("\\boxed{1 / 2}", "1/2"),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_numeric_equality_across_forms():
    assert to_number("0.5") == to_number("1/2") == Fraction(1, 2)
    assert to_number(None) is None


def _prompt(answer: str) -> Prompt:
    return Prompt(id="p", question="q", prompt="q", answer=answer, solution=f"#### {answer}", bucket="easy")


def test_math_reward_scores_by_value():
    reward = MathReward()
    assert reward(_prompt("1234"), "... #### 1,234") == 1.0
    assert reward(_prompt("0.5"), "The answer is 1/2") == 1.0
    assert reward(_prompt("12"), "#### 13") == 0.0
    assert reward(_prompt("12"), "nothing") == 0.0
