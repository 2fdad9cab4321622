"""Prompt variants: recomputed answers checked by an independent evaluator written here."""

import random
import re
from fractions import Fraction
from pathlib import Path

import pytest

from grpo_aug.data.gsm8k import read_gsm8k
from grpo_aug.data.records import Prompt
from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.data.variants import NumericSubstitution, Rephrase, VariantFailed, Variants
from grpo_aug.prompts.curriculum import StagedSchedule
from grpo_aug.prompts.datamodule import PromptDataModule

GSM8K = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "gsm8k" / "train.jsonl"


def calc(text: str) -> Fraction:
    """A tiny recursive-descent evaluator for + - * / and parentheses (independent of grpo_aug)."""
    tokens = re.findall(r"\d*\.\d+|\d+|[-+*/()]", text.replace(",", "").replace("x", "*"))
    pos = 0

    def atom():
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok == "(":
            value = expr()
            pos += 1  # ")"
            return value
        if tok in "+-":
            return -atom() if tok == "-" else atom()
        return Fraction(tok)

    def term():
        nonlocal pos
        value = atom()
        while pos < len(tokens) and tokens[pos] in "*/":
            op = tokens[pos]
            pos += 1
            value = value * atom() if op == "*" else value / atom()
        return value

    def expr():
        nonlocal pos
        value = term()
        while pos < len(tokens) and tokens[pos] in "+-":
            op = tokens[pos]
            pos += 1
            value = value + term() if op == "+" else value - term()
        return value

    return expr()


def test_synthetic_numeric_variants_have_the_right_answer_and_shape():
    records = SyntheticArithmetic(size_per_bucket=60, seed=0).load()
    made = Variants(2, [NumericSubstitution(keep_values=[])], seed=0).make(records)
    assert len(made) >= 100
    by_id = {r.id: r for r in records}
    for v in made:
        expression = re.match(r"What is (.+)\?", v.question).group(1)
        assert Fraction(v.answer) == calc(expression), v  # the question itself, evaluated here
        source = by_id[v.source_id]
        assert v.bucket == source.bucket and v.question != source.question
        old_nums, new_nums = re.findall(r"\d+", source.question), re.findall(r"\d+", v.question)
        assert [len(n) for n in old_nums] == [len(n) for n in new_nums]  # same digit counts
        assert int(v.answer) >= 0  # the synthetic task never goes negative
        assert re.sub(r"\d+", "N", v.question) == re.sub(r"\d+", "N", source.question)


def test_rephrasings_keep_the_answer():
    records = SyntheticArithmetic(size_per_bucket=30, seed=1).load()
    made = Variants(3, [Rephrase()], seed=0).make(records)
    assert {r.source_id for r in made} <= {r.id for r in records} and len(made) > 60
    forms = set()
    by_id = {r.id: r for r in records}
    for v in made:
        source = by_id[v.source_id]
        assert v.answer == source.answer and v.solution == source.solution and v.question != source.question
        assert v.prompt == source.prompt.replace(source.question, v.question)
        q = v.question
        if m := re.fullmatch(r"What is (\d+) more than (\d+)\?", q):
            forms.add("more_than")
            assert int(m.group(1)) + int(m.group(2)) == int(v.answer)
        elif q.startswith("Start with"):
            forms.add("steps")
            value = Fraction(re.match(r"Start with (\d+)", q).group(1))
            for verb, n in re.findall(r"(add|subtract|multiply by) (\d+)", q):
                value = {"add": value + int(n), "subtract": value - int(n), "multiply by": value * int(n)}[verb]
            assert value == Fraction(v.answer)
        else:
            forms.add("ask")
            expression = re.search(r"(?:What is|Compute|Calculate|Find the value of|Evaluate) (.+?)(?:\?| and|\.)", q)
            assert calc(expression.group(1)) == Fraction(v.answer), q
    assert forms == {"more_than", "steps", "ask"}


@pytest.mark.skipif(not GSM8K.is_file(), reason="needs ../shared/data/gsm8k")
def test_gsm8k_variants_recompute_every_step():
    records = read_gsm8k(GSM8K, "Question: {question}\nAnswer: ")[:400]
    variants = Variants(1, [NumericSubstitution()], seed=0)
    made = variants.make(records)
    assert 0.4 < len(made) / variants.attempts < 0.8  # the share reported in the README is 57% on the full file
    by_id = {r.id: r for r in records}
    for v in made:
        steps = re.findall(r"<<([^<>=]+)=([^<>=]+)>>", v.solution)
        for expr, claimed in steps:
            assert calc(expr) == Fraction(claimed.replace(",", "")), (v.id, expr, claimed)
        source = by_id[v.source_id]
        old_final = Fraction(source.answer)
        old_results = [Fraction(c.replace(",", "")) for _, c in re.findall(r"<<([^<>=]+)=([^<>=]+)>>", source.solution)]
        # the answer is the new value of the step that produced the old answer
        new_results = [Fraction(c.replace(",", "")) for _, c in steps]
        k = max(i for i, r in enumerate(old_results) if r == old_final)
        assert Fraction(v.answer) == new_results[k], v.id
        # the question changed only in its numbers, and every changed number is used by a step
        assert re.sub(r"[\d,.]+", "N", v.question) == re.sub(r"[\d,.]+", "N", source.question)
        assert v.question != source.question
        assert v.prompt.endswith(f"{v.question}\nAnswer: ")


def test_numeric_substitution_by_hand():
    p = Prompt("p", "Tom has 48 apples and gives away 13 of them, then buys 25 more. How many now?", "Q", "60",
               "48-13=<<48-13=35>>35\n35+25=<<35+25=60>>60\n#### 60", "easy")
    v = NumericSubstitution()(p, random.Random(0))
    a, b, c = (int(n) for n in re.findall(r"\d+", v.question))
    assert int(v.answer) == a - b + c and a - b >= 0
    assert f"<<{a}-{b}={a - b}>>" in v.solution and f"<<{a - b}+{c}={a - b + c}>>" in v.solution
    # words-as-numbers stay: 2 ("twice") is never substituted
    twice = Prompt("t", "Ann reads 15 pages, then twice as many. Total?", "Q", "45",
                   "15*2=<<15*2=30>>30\n15+30=<<15+30=45>>45\n#### 45", "easy")
    v2 = NumericSubstitution()(twice, random.Random(1))
    n = int(re.search(r"\d+", v2.question).group(0))
    assert int(v2.answer) == 3 * n and "*2=" in v2.solution
    with pytest.raises(VariantFailed, match="no question number feeds"):
        NumericSubstitution()(Prompt("x", "Two and 2?", "Q", "4", "<<2+2=4>>4\n#### 4", "easy"), random.Random(0))
    with pytest.raises(VariantFailed, match="is wrong"):
        NumericSubstitution()(Prompt("x", "What is 15+15?", "Q", "31", "<<15+15=31>>31\n#### 31", "easy"),
                              random.Random(0))


def test_variants_join_training_only_after_the_heldout_split():
    source = SyntheticArithmetic(size_per_bucket=40, seed=0)
    schedule = StagedSchedule([{"until": 1.0, "weights": {"easy": 1.0}}])
    plain = PromptDataModule(source, schedule, total_steps=5, batch_size=4, heldout_per_bucket=10)
    plain.setup("fit")
    varied = PromptDataModule(source, schedule, total_steps=5, batch_size=4, heldout_per_bucket=10,
                              variants=Variants(1, [NumericSubstitution(keep_values=[]), Rephrase()], seed=0))
    varied.setup("fit")
    assert varied.heldout_records == plain.heldout_records
    extra = varied.train_records[len(plain.train_records):]
    assert extra and all(r.source_id in {p.id for p in plain.train_records} for r in extra)
    assert not {r.source_id for r in extra} & {r.id for r in varied.heldout_records}


def test_no_variant_is_a_heldout_question():
    # the easy tier has only 1,000 distinct problems, so new numbers often land on a held-out one
    source = SyntheticArithmetic(size_per_bucket=300, seed=0)
    schedule = StagedSchedule([{"until": 1.0, "weights": {"easy": 1.0}}])
    dm = PromptDataModule(source, schedule, total_steps=5, batch_size=4, heldout_per_bucket=100,
                          variants=Variants(2, [NumericSubstitution(keep_values=[])], seed=0))
    dm.setup("fit")
    held_out = {r.question for r in dm.heldout_records}
    assert dm.variants.held_out > 0  # the guard had something to drop
    assert not held_out & {r.question for r in dm.train_records}
    # the same variants made without the guard: exactly the dropped ones are held-out questions
    originals = [r for r in dm.train_records if r.source_id is None]
    unguarded = Variants(2, [NumericSubstitution(keep_values=[])], seed=0).make(originals)
    assert sum(v.question in held_out for v in unguarded) == dm.variants.held_out
