"""data=dataset: local JSONL/CSV/Parquet/JSON files and directories, column mapping, answer
extraction, tiers from a difficulty column, held-out share, and named bad rows."""

import json

import pytest

from grpo_aug.data.dataset import DatasetSource
from grpo_aug.data.gsm8k import BadRow
from grpo_aug.rewards import AnswerFormat, MathReward

MATH_ROWS = [
    {"problem": "What is $\\frac{1}{2}+\\frac{1}{4}$?", "solution": "We get $\\boxed{\\frac{3}{4}}$.",
     "level": "Level 1", "type": "Prealgebra"},
    {"problem": "Solve $2x=10$.", "solution": "So $x=\\boxed{5}$.", "level": "Level 3", "type": "Algebra"},
    {"problem": "Find the roots of $x^2-1$.", "solution": "They are $\\boxed{\\pm 1}$.", "level": "Level 5",
     "type": "Algebra"},
]
MATH = dict(columns={"question": "problem", "answer": "solution", "solution": "solution", "difficulty": "level"},
            answer_markers=["boxed"])


def _write(path, rows):
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".csv":
        import csv

        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_math_style_file_maps_columns_extracts_boxed_answers_and_tiers_by_level(tmp_path, suffix):
    path = _write(tmp_path / f"math{suffix}", MATH_ROWS)
    records = DatasetSource(str(path), **MATH).load()
    assert [r.answer for r in records] == ["\\frac{3}{4}", "5", "\\pm 1"]
    assert [r.bucket for r in records] == ["easy", "medium", "hard"]  # level 1 <= 2, 3 <= 3, 5
    assert records[0].prompt == MATH_ROWS[0]["problem"] and records[0].solution == MATH_ROWS[0]["solution"]
    reward = MathReward(answer=AnswerFormat(["boxed"], fallback_last_number=False))
    assert reward(records[0], "so it is \\boxed{0.75}") == 1.0
    assert reward(records[2], "\\boxed{\\pm1}") == 1.0 and reward(records[2], "\\boxed{1}") == 0.0


def test_a_directory_reads_the_files_of_each_split(tmp_path):
    _write(tmp_path / "train-00000.parquet", MATH_ROWS[:2])
    _write(tmp_path / "test-00000.parquet", MATH_ROWS[2:])
    source = DatasetSource(str(tmp_path), heldout_split="test", **MATH)
    assert [r.answer for r in source.load()] == ["\\frac{3}{4}", "5"]
    assert [r.answer for r in source.load_heldout()] == ["\\pm 1"]


def test_heldout_share_is_a_fixed_disjoint_split(tmp_path):
    rows = [{"question": f"What is {i}+1?", "answer": str(i + 1), "id": f"q{i}", "difficulty": i % 5}
            for i in range(400)]
    path = _write(tmp_path / "d.jsonl", rows)
    source = DatasetSource(str(path), heldout_share=0.25, columns={"difficulty": "difficulty"})
    train, heldout = source.load(), source.load_heldout()
    assert len(train) + len(heldout) == 400 and not {r.id for r in train} & {r.id for r in heldout}
    assert 60 < len(heldout) < 140  # about a quarter
    assert [r.id for r in DatasetSource(str(path), heldout_share=0.25,
                                        columns={"difficulty": "difficulty"}).load_heldout()] == [r.id for r in heldout]


def test_bad_rows_are_named_by_file_and_line_or_skipped(tmp_path, caplog):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"question": "q1", "answer": "1", "difficulty": 1}) + "\n\n"
                    + "{not json\n"
                    + json.dumps({"question": "q3", "difficulty": 1}) + "\n"
                    + json.dumps({"question": "q4", "answer": "4", "difficulty": "hard"}) + "\n")
    source = DatasetSource(str(path), columns={"difficulty": "difficulty"})
    with pytest.raises(BadRow, match=rf"{path}:3: not valid JSON"):
        source.load()
    records = source.load(on_bad_row="skip")
    assert [r.question for r in records] == ["q1"]
    assert "left out 3 bad row(s)" in caplog.text
    assert f"{path}:4: missing or empty answer column 'answer'" in caplog.text
    assert f"{path}:5: difficulty 'hard' holds no number" in caplog.text
    boxed = _write(tmp_path / "m.csv", [{"problem": "p", "solution": "no box here", "level": "Level 2"}])
    with pytest.raises(BadRow, match=rf"{boxed}:2: no final answer \(boxed\) in column 'solution'"):
        DatasetSource(str(boxed), **MATH).load()


@pytest.mark.parametrize("kwargs, message", [
    (dict(columns={"questoin": "q"}), r"unknown key\(s\) \['questoin'\]"),
    (dict(), r"tiers=column needs data.source.columns.difficulty"),
    (dict(tiers="guess"), r"data.source.tiers must be one of \['column', 'pass_rate'\], got 'guess'"),
    (dict(tiers="pass_rate", heldout_share=1.5), r"heldout_share must be in \(0, 1\), got 1.5"),
    (dict(tiers="pass_rate", heldout_split="test"), r"is one file, which has no splits"),
])
def test_bad_source_settings_are_named(tmp_path, kwargs, message):
    path = _write(tmp_path / "d.jsonl", MATH_ROWS)
    with pytest.raises(ValueError, match=message):
        DatasetSource(str(path), **kwargs)
