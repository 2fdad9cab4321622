from fractions import Fraction

import pytest

from grpo_aug.mathtext import NotArithmetic, evaluate, matches


@pytest.mark.parametrize(
    "expression, value",
    [
        ("48/2", Fraction(24)),
        ("2+3*4", Fraction(14)),
        ("(2+3)*4", Fraction(20)),
        ("10/3", Fraction(10, 3)),
        ("-5+2", Fraction(-3)),
        ("1,200*3", Fraction(3600)),
        ("$12.50*2", Fraction(25)),
        ("0.1+0.2", Fraction(3, 10)),  # exact: not the binary float 0.30000000000000004
        ("20%*50", Fraction(10)),
        ("6 x 7", Fraction(42)),
        ("12÷4", Fraction(3)),
    ],
)
def test_values(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",  # a call: rejected without running anything
        "a+1",  # names
        "2**10",  # powers are not grade-school steps and can blow up
        "1/0",
        "1 if 1 else 2",
        "[1, 2]",
        "",
        "9" * 30,  # beyond the value bound
        "1+" * 150 + "1",  # beyond the length bound
        "-" * 40 + "1",  # beyond the depth bound (40 nested unary minus)
    ],
)
def test_rejects_everything_else(expression):
    with pytest.raises(NotArithmetic):
        evaluate(expression)


def test_matches_up_to_the_decimals_written():
    third = Fraction(10, 3)
    assert matches(third, "3.33") and matches(third, "3.3")
    assert not matches(third, "3.4") and not matches(third, "3")
    assert matches(Fraction(24), "24") and matches(Fraction(1200), "1,200") and not matches(Fraction(24), "25")
    assert not matches(Fraction(1), "one")
