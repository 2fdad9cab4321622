"""Role reversal and constraint change: answers recomputed, then checked by evaluating the new
question independently (X substituted back, or the new expression as written)."""

import random
import re

import pytest

from grpo_aug.data.records import Prompt
from grpo_aug.data.role_variants import ConstraintChange, RoleReversal
from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.data.variants import VariantFailed
from grpo_aug.mathtext import evaluate


def _record(question, solution, answer, bucket="easy"):
    return Prompt("r", question, f"Q: {question}\nA: ", answer, solution, bucket)


def test_reversal_of_a_one_step_problem_by_hand():
    v = RoleReversal()(_record("What is 47 + 8?", "<<47+8=55>>55\n#### 55", "55"), random.Random(0))
    assert v.question == "What is X + 8? The answer is 55. What is X?"
    assert v.prompt == f"Q: {v.question}\nA: "
    assert (v.answer, v.solution) == ("47", "<<55-8=47>>47\n#### 47")


def test_reversal_of_a_three_step_chain_by_hand():
    rec = _record("What is (47 + 38) * 3 - 12?", "<<47+38=85>>85\n<<85*3=255>>255\n<<255-12=243>>243\n#### 243",
                  "243", "hard")
    v = RoleReversal()(rec, random.Random(0))
    assert v.answer == "47"
    assert v.solution == "<<243+12=255>>255\n<<255/3=85>>85\n<<85-38=47>>47\n#### 47"


def test_reversal_of_a_gsm8k_problem():
    rec = _record("Weng earns $18 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
                  "How much did she earn?",
                  "Weng earns 18/60 = $<<18/60=0.3>>0.3 per minute.\nWorking 50 minutes, she earned 0.3 x 50 = "
                  "$<<0.3*50=15>>15.\n#### 15", "15")
    v = RoleReversal()(rec, random.Random(0))
    assert v.question.startswith("Weng earns $X an hour") and v.question.endswith("The answer is 15. What is X?")
    assert (v.answer, v.solution) == ("18", "<<15/50=0.3>>0.3\n<<0.3*60=18>>18\n#### 18")
    with pytest.raises(VariantFailed, match="may stand for a word"):  # $12 could be "a dozen" elsewhere
        RoleReversal()(_record(rec.question.replace("18", "12"), "<<12/60=0.2>>0.2\n<<0.2*50=10>>10\n#### 10",
                               "10"), random.Random(0))


def test_reversal_fails_cleanly_where_the_chain_does_not_allow_it():
    with pytest.raises(VariantFailed, match="not a path"):  # the second step ignores the first result
        RoleReversal()(_record("A has 3 and B has 4 ...", "<<3*2=6>>6 <<4*5=20>>20 <<6+20=26>>26\n#### 26", "26"),
                       random.Random(0))
    with pytest.raises(VariantFailed, match="twice"):  # Natalia: X + X / 2 = 72 needs algebra, not inversion
        RoleReversal()(_record("Natalia sold clips to 48 of her friends in April, and then half as many in May. "
                               "How many clips did she sell?", "<<48/2=24>>24\n<<48+24=72>>72\n#### 72", "72"),
                       random.Random(0))
    with pytest.raises(VariantFailed, match="twice"):
        RoleReversal()(_record("What is 5 + 5?", "<<5+5=10>>10\n#### 10", "10"), random.Random(0))
    with pytest.raises(VariantFailed, match="exactly once"):  # which 9 would X be?
        RoleReversal()(_record("Tom has 9 apples and 9 pears. He eats 3 apples. How many apples are left?",
                               "<<9-3=6>>6\n#### 6", "6"), random.Random(0))


def _expression_value(question):
    return evaluate(re.match(r"^What is (.+)\?$", question).group(1))


def test_every_synthetic_variant_checks_out_independently():
    # the hard tier with products, which a constraint change can reorder into another answer
    records = SyntheticArithmetic(size_per_bucket=60, seed=3, tiers={"hard": {"ops": "+-*", "operand": None}}).load()
    made = {"reversal": 0, "constraint": 0}
    for i, rec in enumerate(records):
        try:
            v = RoleReversal()(rec, random.Random(i))
        except VariantFailed as err:
            # the starting number occurs twice ("What is 5 + 5?"), or a step adds the previous
            # result to itself ("1 + 5 + 6": which 6 is carried is ambiguous)
            assert "twice" in str(err) or "exactly once" in str(err) or "not a path" in str(err)
        else:
            made["reversal"] += 1
            # put the answer back for X: the original question's value must be the stated result
            stated = re.search(r"The answer is (\d+)\. What is X\?$", v.question).group(1)
            assert _expression_value(v.question.split(" The answer")[0].replace("X", v.answer)) == int(stated)
        try:
            c = ConstraintChange()(rec, random.Random(i))
        except VariantFailed:  # one step, or every swap leaves the integers or keeps the answer
            continue
        made["constraint"] += 1
        assert _expression_value(c.question) == int(c.answer) != int(rec.answer)
        assert c.solution.endswith(f"#### {c.answer}") and rec.bucket != "easy"
    # reversals of all 180; constraint changes of the 60 hard problems only: reordering a chain of
    # additions and subtractions (all of medium) keeps its answer
    assert made["reversal"] > 170 and made["constraint"] > 30


def test_constraint_change_by_hand_and_not_for_gsm8k():
    rec = _record("What is (47 + 38) * 3 - 12?", "<<47+38=85>>85\n<<85*3=255>>255\n<<255-12=243>>243\n#### 243",
                  "243", "hard")
    outcomes = {ConstraintChange()(rec, random.Random(s)).question for s in range(20)}
    assert outcomes == {"What is 47 * 3 + 38 - 12?", "What is (47 + 38 - 12) * 3?"}
    with pytest.raises(VariantFailed, match="synthetic"):
        ConstraintChange()(_record("Weng earns $12 an hour.", "<<12/60=0.2>>0.2\n#### 0.2", "0.2"), random.Random(0))
