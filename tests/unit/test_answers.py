from fractions import Fraction
from pathlib import Path

import pytest

from grpo_aug.answers import AUTO, normalize, value
from grpo_aug.data.records import Prompt
from grpo_aug.rewards import AnswerFormat, MathReward

BOXED = AnswerFormat(["boxed"], fallback_last_number=False)
TAG = AnswerFormat(["tag"], fallback_last_number=False)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<<48/2=24>>24 clips\n<<48+24=72>>72\n#### 72", Fraction(72)),
        ("so the total is \\boxed{1,234}", Fraction(1234)),
        ("The answer is $18.00.", Fraction(18)),
        ("the final answer is: 50%", Fraction(50)),
        ("Q: what\nA: 3/4", Fraction(3, 4)),
        ("I think 5 then 7 then 12.50", Fraction(25, 2)),
        ("#### 7 but later 9", Fraction(7)),
        ("#### -3", Fraction(-3)),
        ("The answer is 4. #### 5", Fraction(5)),
        ("\\boxed{1 / 2}", Fraction(1, 2)),
    ],
)
def test_auto_format_reads_gsm8k_style_answers(text, expected):
    assert value(normalize(AUTO.extract(text))) == expected


def test_no_digits_no_answer():
    assert AUTO.extract("no digits here") is None
    assert BOXED.extract("The answer is 5") is None  # boxed only: no marker, no fallback


QWEN_MATH = r"""To find the probability, we count the favourable outcomes: there are $\binom{4}{2} = 6$ ways.
The total is $\binom{6}{2} = 15$, so the probability is $\frac{6}{15} = \frac{2}{5}$.

Therefore, the final answer is $\boxed{\dfrac{2}{5}}$."""

R1_STYLE = """<think>
Let x be the number of apples. Then 3x + 4 = 19, so 3x = 15 and x = 5.
</think>
<answer>5</answer>"""


@pytest.mark.parametrize("fmt, text, reference, correct", [
    (BOXED, QWEN_MATH, "\\frac{2}{5}", True),
    (BOXED, QWEN_MATH, "0.4", True),  # by value
    (BOXED, QWEN_MATH, "2/3", False),
    (BOXED, r"The set is $\boxed{\{1, 2\}}$ and the sum is \boxed{3}", "3", True),  # last match
    (BOXED, r"so $\boxed{x^{2}+1}$.", "x^{2} + 1", True),  # text, not a number
    (BOXED, r"$\boxed{\left( 3, \frac{\pi}{2} \right)}$", r"(3,\frac{\pi}{2})", True),
    (BOXED, r"The angle is \boxed{30^\circ}", "30", True),
    (BOXED, r"It takes \boxed{10 \text{ minutes}}.", "10", True),
    (BOXED, r"\boxed{\frac{\frac{1}{2}}{3}}", "1/6", True),  # nested fractions
    (BOXED, r"\boxed{1{,}000}", "1000", True),
    (BOXED, r"\boxed{x = 7}", "7", True),
    (BOXED, r"\boxed{5", "5", False),  # unclosed: no answer
    (TAG, R1_STYLE, "5", True),
    (TAG, "<answer>\\boxed{12}</answer>", "12", True),
    (TAG, "<answer>4</answer> then <answer>6</answer>", "6", True),
    (TAG, "<answer>6", "6", False),
])
def test_boxed_and_tag_formats_on_real_looking_outputs(fmt, text, reference, correct):
    assert fmt.correct(text, reference) is correct


def test_first_or_last_match_and_custom_patterns():
    text = r"First \boxed{3}, on reflection \boxed{4}."
    assert AnswerFormat(["boxed"], False, pick="first").extract(text) == "3"
    assert AnswerFormat(["boxed"], False, pick="last").extract(text) == "4"
    custom = AnswerFormat([], patterns=[r"Final: (\S+)"], fallback_last_number=False)
    assert custom.extract("work work\nFinal: 17\nFinal: 18") == "18"
    assert custom.extract("no marker 99") is None


@pytest.mark.parametrize("kwargs, message", [
    (dict(markers=["boxxed"]), r"unknown marker\(s\) \['boxxed'\]"),
    (dict(pick="middle"), r"answer.pick must be one of \['first', 'last'\], got 'middle'"),
    (dict(patterns=["(a)(b)"]), r"answer.patterns\[0\] = '\(a\)\(b\)' must have exactly one group"),
    (dict(patterns=["(unclosed"]), r"answer.patterns\[0\] = '\(unclosed' is not a valid regex"),
])
def test_bad_format_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AnswerFormat(**{"markers": ["boxed"], "fallback_last_number": False, **kwargs})


def test_the_python_auto_format_is_conf_answer_auto():
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    conf = Path(__file__).resolve().parents[2] / "conf" / "answer"
    built = instantiate(OmegaConf.load(conf / "auto.yaml"))
    assert (built.markers, built.pick, built.fallback_last_number) == (AUTO.markers, AUTO.pick,
                                                                        AUTO.fallback_last_number)
    assert len(built.finders) == len(AUTO.finders)


def _prompt(answer: str) -> Prompt:
    return Prompt(id="p", question="q", prompt="q", answer=answer, solution=f"#### {answer}", bucket="easy")


def test_math_reward_scores_by_value_with_the_configured_format():
    reward = MathReward()
    assert reward(_prompt("1234"), "... #### 1,234") == 1.0
    assert reward(_prompt("0.5"), "The answer is 1/2") == 1.0
    assert reward(_prompt("12"), "#### 13") == 0.0
    assert reward(_prompt("12"), "nothing") == 0.0
    assert MathReward(answer=BOXED)(_prompt("\\frac{2}{5}"), QWEN_MATH) == 1.0
    with pytest.raises(ValueError, match="no usable reference answer"):
        reward(_prompt("  "), "#### 1")


@pytest.mark.parametrize("text, strict, soft", [
    (R1_STYLE, 1.0, 1.0),
    ("<think>\nx\n</think>\n<answer>\n5\n</answer>\n", 1.0, 1.0),  # trailing whitespace is fine
    ("<think>x</think> <answer>5</answer>", 1.0, 1.0),  # one line is fine
    ("<think>x</think> so <answer>5</answer>", 0.0, 1.0),  # text between the blocks: soft only
    ("Sure! <think>\nx\n</think>\n<answer>\n5\n</answer>", 0.0, 1.0),  # text before the tags
    ("<think>\nx\n</think>\n<answer>\n5\n</answer>\n<answer>\n6\n</answer>", 0.0, 1.0),  # a tag twice
    ("<answer>5</answer><think>x</think>", 0.0, 0.0),  # wrong order
    ("<think>\nx\n</think>", 0.0, 0.0),
])
def test_r1_format_reward_strict_and_soft(text, strict, soft):
    from grpo_aug.rewards import ThinkAnswerFormat

    prompt = _prompt("5")
    assert ThinkAnswerFormat("strict")(prompt, text) == strict
    assert ThinkAnswerFormat("soft")(prompt, text) == soft


def test_r1_reward_config_scores_answer_and_format(tmp_path):
    from hydra.utils import instantiate

    from helpers import compose_cfg

    reward = instantiate(compose_cfg(tmp_path, ["reward=r1", "answer=tag"]).reward, _convert_="all")
    wrong = "<think>\nx\n</think>\n<answer>\n4\n</answer>"
    scores = reward.score([_prompt("5")], [[R1_STYLE, "<answer>5</answer>", wrong]])
    assert scores.total.tolist() == [[2.0, 1.0, 1.0]]  # answer + format


FREE_TEXT = AnswerFormat(markers=["hash", "boxed", "answer_is", "equals"], fallback_last_number=True)


@pytest.mark.parametrize("completion, stated", [
    # SmolLM2-135M-Instruct's own greedy answers to the synthetic questions (answer=free_text)
    ("To add 94 and 2, you simply add them together: 94 + 2 = 130.", "130"),
    ("To convert 57 + 4 to a decimal, you can simply add 57 and 4. 57 + 4 equals 61.", "61"),
    ("To solve this problem, you need to first subtract 4 from 27, which is 7, and then add 7.\n\n"
     "So, 27 + 7 = 24, and 24 - 7 = 13.\n\nSo, 27 + ", "13"),  # cut at max_new_tokens: the last '=' stands
    ("43 - 3 - 6 - 1 = 12", "12"),
    ("Therefore, 47 + 8 is equal to 55.", "55"),
    ("To add 47 and 8, we need to combine them. The answer is 55.", "55"),
    ("47 + 8 = 54. Wait: the answer is 55", "55"),  # an explicit statement beats an earlier '='
    ("The final answer is $\\boxed{55}$. Check: 55 - 8 = 47", "55"),  # so does \boxed{}
    ("<<47+8=55>>55\n#### 55", "55"),
    ("First we add 47 and 8 which gives 55", "55"),  # no marker: the last number
    ("I cannot compute that.", None),
])
def test_free_text_answers(completion, stated):
    found = FREE_TEXT.extract(completion)
    assert (found if found is None else normalize(found)) == stated


def test_free_text_compares_by_value():
    assert FREE_TEXT.correct("So, 47 + 8 = 55.00", "55")
    assert FREE_TEXT.correct("The answer is 1,055.", "1055")
    assert not FREE_TEXT.correct("So, 47 + 8 = 15.", "55")
