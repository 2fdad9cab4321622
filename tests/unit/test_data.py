import json
import logging
import os
import re

import pytest

from grpo_aug.data.gsm8k import GSM8KSource, read_gsm8k
from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.prompts.batch_sampler import CurriculumBatchSampler
from grpo_aug.prompts.curriculum import StagedSchedule
from grpo_aug.prompts.datamodule import PaddingBatch, PromptDataModule, split_heldout
from helpers import ROOT, first_existing

GSM8K = first_existing(
    os.environ.get("GRPO_AUG_GSM8K", ""),
    ROOT.parent / "shared/data/gsm8k/train.jsonl",
    "/work/shared/data/gsm8k/train.jsonl",
)
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
STEP = re.compile(r"<<(\d+)([+\-*])(\d+)=(\d+)>>(\d+)")


def test_synthetic_is_deterministic_and_tiered():
    a = SyntheticArithmetic(size_per_bucket=200, seed=3).load()
    b = SyntheticArithmetic(size_per_bucket=200, seed=3).load()
    assert a == b
    assert a != SyntheticArithmetic(size_per_bucket=200, seed=4).load()
    steps = {"easy": 1, "medium": 2, "hard": 3}
    for r in a:
        lines = r.solution.split("\n")
        assert len(lines) == steps[r.bucket] + 1 and lines[-1] == f"#### {r.answer}"


def test_synthetic_solutions_compute_the_question():
    for r in SyntheticArithmetic(size_per_bucket=300, seed=0).load():
        value = None
        for a, op, b, c, shown in STEP.findall(r.solution):
            a, b, c = int(a), int(b), int(c)
            assert value is None or a == value  # each step continues from the previous result
            assert OPS[op](a, b) == c == int(shown) and c >= 0
            value = c
        assert value == int(r.answer)
        # the question itself, evaluated by an independent left-to-right parser, gives the answer
        tokens = r.question.removeprefix("What is ").removesuffix("?").replace("(", "").replace(")", "").split()
        acc = int(tokens[0])
        for op, num in zip(tokens[1::2], tokens[2::2], strict=True):
            acc = OPS[op](acc, int(num))
        assert acc == int(r.answer)


def test_synthetic_tiers_use_their_operations_and_operand_ranges():
    seen = {b: set() for b in ("easy", "medium", "hard")}
    for r in SyntheticArithmetic(size_per_bucket=300, seed=1).load():
        for i, (_, op, b, _, _) in enumerate(STEP.findall(r.solution)):
            seen[r.bucket].add(op)
            assert 0 <= int(b) <= 9, (r.question, i)  # every later operand is a single digit
    assert seen == {"easy": {"+"}, "medium": {"+", "-"}, "hard": {"+", "-"}}


def test_synthetic_tiers_are_configurable_and_checked():
    # two-digit operands and products in hard, easy and medium as they were
    tiers = {"hard": {"ops": "+-*", "operand": None}}
    records = SyntheticArithmetic(size_per_bucket=300, seed=1, tiers=tiers).load()
    default = SyntheticArithmetic(size_per_bucket=300, seed=1).load()
    assert [r for r in records if r.bucket != "hard"] == [r for r in default if r.bucket != "hard"]
    ops, operands = set(), []
    for r in records:
        if r.bucket == "hard":
            for _, op, b, _, _ in STEP.findall(r.solution):
                ops.add(op)
                operands.append(int(b))
                assert 2 <= int(b) <= 9 if op == "*" else 0 <= int(b) <= 99
    assert ops == {"+", "-", "*"} and max(operands) > 9
    four = SyntheticArithmetic(size_per_bucket=20, seed=0, tiers={"hard": {"steps": 4}}).load()
    assert {len(STEP.findall(r.solution)) for r in four if r.bucket == "hard"} == {4}
    with pytest.raises(ValueError, match=r"data.source.tiers.hard.ops must be .* got '\+/'"):
        SyntheticArithmetic(tiers={"hard": {"ops": "+/"}})
    with pytest.raises(ValueError, match=r"data.source.tiers: unknown buckets \['expert'\]"):
        SyntheticArithmetic(tiers={"expert": {"steps": 4}})
    with pytest.raises(ValueError, match=r"data.source.tiers.medium.steps must be >= 1, got 0"):
        SyntheticArithmetic(tiers={"medium": {"steps": 0}})


@pytest.mark.skipif(GSM8K is None, reason="GSM8K train.jsonl not found (set GRPO_AUG_GSM8K)")
def test_gsm8k_real_file_parses_and_tiers():
    records = read_gsm8k(GSM8K, "Question: {question}\nAnswer: ")
    assert len(records) == 7473
    first = records[0]
    assert first.answer == "72" and first.bucket == "easy"  # two <<...>> steps
    counts = {b: sum(r.bucket == b for r in records) for b in ("easy", "medium", "hard")}
    # independent count: calculator annotations straight from the raw JSON
    steps = [json.loads(line)["answer"].count("<<") for line in open(GSM8K) if line.strip()]
    expected = {"easy": sum(s <= 2 for s in steps), "medium": sum(3 <= s <= 4 for s in steps),
                "hard": sum(s >= 5 for s in steps)}
    assert counts == expected == {"easy": 2674, "medium": 3561, "hard": 1238}


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"question": "q"}', "missing or empty 'answer'"),
        ('{"answer": "#### 3"}', "missing or empty 'question'"),
        ("{not json", "not valid JSON"),
        ('{"question": "q", "answer": "no marker"}', "'#### N'"),
    ],
)
def test_gsm8k_bad_line_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"question": "q", "answer": "<<1+1=2>>2\n#### 2"})
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(ValueError, match=rf"bad.jsonl:2: .*{re.escape(message)}"):
        read_gsm8k(path, "{question}")


def test_duplicate_ids_and_non_numeric_answers_name_file_and_line(tmp_path):
    path = tmp_path / "ids.jsonl"
    rows = [{"id": "a", "question": "q1", "answer": "#### 1"}, {"id": "b", "question": "q2", "answer": "#### 2"},
            {"id": "a", "question": "q3", "answer": "#### 3"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(ValueError, match=r"ids.jsonl:3: duplicate id 'a' \(first used at .*ids.jsonl:1\)"):
        read_gsm8k(path, "{question}")
    path.write_text(json.dumps({"question": "q", "answer": "#### seven"}) + "\n")
    with pytest.raises(ValueError, match=r"ids.jsonl:1: final answer after '####' is not a number: 'seven'"):
        read_gsm8k(path, "{question}")


def test_skip_leaves_bad_rows_out_counts_and_summarises(tmp_path, caplog):
    path = tmp_path / "mixed.jsonl"
    lines = [json.dumps({"question": "q1", "answer": "<<1+1=2>>2\n#### 2"}), "{not json",
             json.dumps({"question": "q2"}), json.dumps({"question": "q3", "answer": "#### x"}),
             json.dumps({"question": "q4", "answer": "#### 4"})]
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level("WARNING"):
        records = read_gsm8k(path, "{question}", on_bad_row="skip")
    assert [r.question for r in records] == ["q1", "q4"] and [r.id for r in records] == ["mixed-1", "mixed-5"]
    assert "left out 3 bad row(s)" in caplog.text and "(2 kept)" in caplog.text
    for line, what in ((2, "not valid JSON"), (3, "missing or empty 'answer'"), (4, "is not a number")):
        assert f"mixed.jsonl:{line}: " in caplog.text and what in caplog.text
    with pytest.raises(ValueError, match="data.on_bad_row must be one of"):
        read_gsm8k(path, "{question}", on_bad_row="ignore")


def test_a_bucket_the_schedule_needs_but_lacks_fails_at_setup(tmp_path, caplog):
    path = tmp_path / "easy_only.jsonl"
    path.write_text("\n".join(json.dumps({"question": f"q{i}", "answer": "<<1+1=2>>2\n#### 2"}) for i in range(40)))
    schedule = StagedSchedule([{"until": 0.5, "weights": {"easy": 1.0}}, {"until": 1.0, "weights": {"hard": 1.0}}])
    dm = PromptDataModule(GSM8KSource(str(path)), schedule, total_steps=10, batch_size=4, heldout_per_bucket=2,
                          mix_buckets=False)
    with pytest.raises(ValueError,
                       match=r"prompts.curriculum.stages\[1\].weights.hard asks for bucket 'hard', but it has 0"):
        dm.setup("fit")
    # mixed batches (the default) give hard's slots to the nearest bucket with prompts, and say so
    mixed = PromptDataModule(GSM8KSource(str(path)), schedule, total_steps=10, batch_size=4, heldout_per_bucket=2)
    with caplog.at_level(logging.WARNING):
        mixed.setup("fit")
    assert ("prompts.curriculum.stages[1].weights.hard may weight bucket 'hard', which has no training prompts"
            in caplog.text)
    late = list(mixed.make_sampler(0, 0, 1))[5:]  # the hard stage
    assert all(b == "easy" for batch in late for _, b in batch)


def test_missing_data_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        GSM8KSource(str(tmp_path / "nope.jsonl"))


def test_heldout_is_disjoint_and_sized():
    records = SyntheticArithmetic(size_per_bucket=300, seed=0).load()
    train, held = split_heldout(records, 50, seed=0)
    assert len(held) == 150 and len(train) == 750
    assert not {r.question for r in train} & {r.question for r in held}


def _sampler(rank, world, schedule=None, start=0):
    indices = {"easy": list(range(0, 100)), "medium": list(range(100, 200)), "hard": list(range(200, 300))}
    schedule = schedule or StagedSchedule([{"until": 1.0, "weights": {"easy": 0.5, "medium": 0.3, "hard": 0.2}}])
    return CurriculumBatchSampler(indices, 8, schedule, 50, seed=1, rank=rank, world_size=world, start_step=start)


def test_batches_are_single_bucket_and_rank_disjoint():
    ranks = [[[i for i, _ in batch] for batch in _sampler(r, 2)] for r in range(2)]
    for b0, b1 in zip(*ranks, strict=True):
        assert len({i // 100 for i in b0 + b1}) == 1  # one bucket, same on both ranks
        assert not set(b0) & set(b1) and len(set(b0 + b1)) == 16


def test_resume_yields_the_same_remaining_batches():
    assert list(_sampler(0, 1))[20:] == list(_sampler(0, 1, start=20))


def test_staged_schedule_by_hand():
    s = StagedSchedule([{"until": 0.2, "weights": {"easy": 1.0}},
                        {"until": 1.0, "weights": {"easy": 0.5, "hard": 0.5}}])
    assert s.weights(19, 100) == {"easy": 1.0, "medium": 0.0, "hard": 0.0}
    assert s.weights(20, 100) == {"easy": 0.5, "medium": 0.0, "hard": 0.5}


@pytest.mark.parametrize(
    "stages, message",
    [
        ([{"until": 1.0, "weights": {"easy": 0.5}}], "sum to 1"),
        ([{"until": 1.0, "weights": {"trivial": 1.0}}], "unknown bucket 'trivial'"),
        ([{"until": 0.5, "weights": {"easy": 1.0}}], "must be 1.0"),
    ],
)
def test_bad_schedule_fails_naming_the_problem(stages, message):
    with pytest.raises(ValueError, match=message):
        StagedSchedule(stages)


def test_schedule_needing_an_empty_bucket_fails_at_setup():
    source = SyntheticArithmetic(size_per_bucket=20, seed=0)
    schedule = StagedSchedule([{"until": 1.0, "weights": {"hard": 1.0}}])
    dm = PromptDataModule(source, schedule, total_steps=10, batch_size=16, heldout_per_bucket=10, mix_buckets=False)
    with pytest.raises(ValueError,
                       match=r"prompts.curriculum.stages\[0\].weights.hard asks for bucket 'hard', but it has 10 "):
        dm.setup("fit")
    # mixed: its 10 hard prompts and 6 of the nearest bucket; 30 in all is still too few for 32
    mixed = PromptDataModule(source, schedule, total_steps=10, batch_size=16, heldout_per_bucket=10)
    mixed.setup("fit")
    assert sorted(b for _, b in mixed.make_sampler(0, 0, 1).draw(0)) == ["hard"] * 10 + ["medium"] * 6
    with pytest.raises(ValueError, match="the data holds 30 training prompts, fewer than data.batch_size x world "
                                         "size = 32"):
        mixed.make_sampler(0, 0, 2)


@pytest.mark.parametrize("val_batch_size, world, per_rank", [(10, 2, 2), (10, 3, 1), (4, 2, 5), (4, 4, 3)])
def test_every_rank_gets_as_many_heldout_batches_and_each_prompt_counts_once(val_batch_size, world, per_rank):
    schedule = StagedSchedule([{"until": 1.0, "weights": {"easy": 1.0}}])
    dm = PromptDataModule(SyntheticArithmetic(size_per_bucket=40, seed=0), schedule, total_steps=5, batch_size=4,
                          heldout_per_bucket=10, val_batch_size=val_batch_size)
    dm.setup("fit")
    ranks = [dm.val_batches(r, world) for r in range(world)]
    # 3 buckets of 10: batches of 10 -> 3 batches; of 4 -> 4 + 4 + 2 per bucket, 9 batches
    assert [len(b) for b in ranks] == [per_rank] * world
    counted = [p.id for b in ranks for batch in b if not isinstance(batch, PaddingBatch) for p in batch]
    assert sorted(counted) == sorted(r.id for r in dm.heldout_records)
    padding = [batch for b in ranks for batch in b if isinstance(batch, PaddingBatch)]
    assert len(padding) == world * per_rank - (3 if val_batch_size == 10 else 9)
    assert all(len(batch) == 1 for batch in padding)
    alone = dm.val_batches(0, 1)
    assert len(alone) == (3 if val_batch_size == 10 else 9) and not any(isinstance(b, PaddingBatch) for b in alone)
