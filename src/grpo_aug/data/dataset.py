"""Any question/answer dataset (`data=dataset`): a local JSONL, JSON, Parquet or CSV file, a
directory of them, or a hub dataset id (through the `datasets` library, where a hub is reachable).

Columns are mapped by name (`columns.question|answer|solution|difficulty`). A question column
that holds a list of `{role, content}` messages (TRL's conversational `prompt`) is a conversation:
its last user message is the question, the messages before it go to the chat template
(data/prompt_format=chat). Every column of a row is kept on its record for reward functions
written for TRL, which take them as keyword arguments. The answer column is
taken as written, or, with `answer_markers` (e.g. [boxed] for MATH solutions, [hash] for GSM8K's),
the final answer is extracted from it. Tiers come from a difficulty column (numbers, or text with
one, such as MATH's "Level 3": <= easy_max easy, <= medium_max medium, else hard), or, with
`tiers: pass_rate`, from the starting policy's measured pass rate (prompts/pass_rate.py) before
training. Bad rows are named `file:line` (JSONL, CSV) or `file[row i]` and stop the run, or with
data.on_bad_row=skip are left out and summarised, as for GSM8K.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

from grpo_aug.answers import AnswerFormat, normalize
from grpo_aug.data.gsm8k import bucket_for_steps
from grpo_aug.data.records import ROLES, Prompt
from grpo_aug.data.rows import BadRow, keep_good_rows
from grpo_aug.errors import MissingFile, UsageError

log = logging.getLogger(__name__)

SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
TIERS = ("column", "pass_rate")
_FIRST_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _rows_of_file(path: Path) -> Iterator[tuple[str, object]]:
    """(where, row) for every row of one local file."""
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if line.strip():
                    where = f"{path}:{lineno}"
                    try:
                        yield where, json.loads(line)
                    except json.JSONDecodeError as err:
                        yield where, BadRow(f"{where}: not valid JSON ({err.msg})")
    elif path.suffix == ".csv":
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            for row in reader:
                yield f"{path}:{reader.line_num}", row
    elif path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = data if isinstance(data, list) else data.get("data") if isinstance(data, dict) else None
        if not isinstance(rows, list):
            raise UsageError(f"{path}: expected a JSON list of objects (or {{\"data\": [...]}})")
        for i, row in enumerate(rows):
            yield f"{path}[row {i}]", row
    else:
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist()):
            yield f"{path}[row {i}]", row


def read_rows(source: str, split: str) -> Iterator[tuple[str, object]]:
    """Every row of a local file, of a directory's files whose name holds `split`, or of a hub
    dataset's split."""
    path = Path(source)
    if path.is_file():
        yield from _rows_of_file(path)
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and split in p.name)
        if not files:
            raise MissingFile(f"data.source.path={source!r}: no {'/'.join(SUFFIXES)} file with "
                                    f"{split!r} in its name")
        for f in files:
            yield from _rows_of_file(f)
    else:
        import datasets

        try:
            table = datasets.load_dataset(source, split=split)
        except Exception as err:  # the library raises many kinds; the message names the cause
            raise MissingFile(f"data.source.path={source!r}: not a local file or directory, and the "
                                    f"hub dataset could not be loaded ({type(err).__name__}: {err})") from err
        for i, row in enumerate(table):
            yield f"{source}:{split}[row {i}]", row


def conversation(messages: list, where: str, column: str) -> tuple[tuple[tuple[str, str], ...], str]:
    """A conversational prompt (a list of {role, content} messages ending with the user's) as
    (the earlier messages as (role, content) pairs, the last user message)."""
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
            raise BadRow(f"{where}: column {column!r} message {i} is not a {{role, content}} message with a role in "
                         f"{list(ROLES)} and text content: {str(m)[:80]!r}")
    if not messages or messages[-1]["role"] != "user" or not messages[-1]["content"].strip():
        raise BadRow(f"{where}: column {column!r} must end with a non-empty user message, got "
                     f"{str(messages[-1:])[:80]!r}")
    return tuple((m["role"], m["content"]) for m in messages[:-1]), messages[-1]["content"].strip()


class DatasetSource:
    def __init__(self, path: str, split: str = "train", heldout_split: str | None = None,
                 heldout_path: str | None = None, heldout_share: float | None = None, columns: dict | None = None,
                 answer_markers: list[str] | None = None, tiers: str = "column", easy_max: float = 2,
                 medium_max: float = 3, prompt_template: str = "{question}", pass_rate_samples: int = 8,
                 pass_rate_temperature: float = 1.0, easy_min: float = 0.7, hard_max: float = 0.2) -> None:
        columns = {"question": "question", "answer": "answer", "solution": None, "difficulty": None,
                   **(columns or {})}
        unknown = set(columns) - {"question", "answer", "solution", "difficulty"}
        checks = [
            (not unknown, f"data.source.columns: unknown key(s) {sorted(unknown)}; known: question, answer, "
                          "solution, difficulty"),
            (tiers in TIERS, f"data.source.tiers must be one of {list(TIERS)}, got {tiers!r}"),
            (tiers != "column" or columns["difficulty"],
             "data.source.tiers=column needs data.source.columns.difficulty (a difficulty column), or use "
             "data.source.tiers=pass_rate"),
            (sum(x is not None for x in (heldout_split, heldout_path, heldout_share)) <= 1,
             "data.source: set at most one of heldout_split, heldout_path and heldout_share"),
            (heldout_split is None or not Path(path).is_file(),
             f"data.source.heldout_split={heldout_split!r}: {path} is one file, which has no splits; set "
             "data.source.heldout_path (another file) or data.source.heldout_share"),
            (heldout_share is None or 0 < heldout_share < 1,
             f"data.source.heldout_share must be in (0, 1), got {heldout_share}"),
            (easy_max < medium_max, f"data.source: need easy_max < medium_max, got {easy_max}, {medium_max}"),
            (pass_rate_samples >= 1, f"data.source.pass_rate_samples must be >= 1, got {pass_rate_samples}"),
            (pass_rate_temperature > 0,
             f"data.source.pass_rate_temperature must be > 0, got {pass_rate_temperature}"),
            (0 <= hard_max < easy_min <= 1,
             f"data.source: need 0 <= hard_max < easy_min <= 1, got {hard_max}, {easy_min}"),
            ("{question}" in prompt_template,
             f"data.source.prompt_template must contain {{question}}, got {prompt_template!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        self.path, self.split, self.heldout_split, self.heldout_share = str(path), split, heldout_split, heldout_share
        self.heldout_path = heldout_path
        self.columns, self.tiers = columns, tiers
        self.extract = AnswerFormat(answer_markers, fallback_last_number=False) if answer_markers else None
        self.easy_max, self.medium_max, self.prompt_template = easy_max, medium_max, prompt_template
        self.pass_rate_samples, self.pass_rate_temperature = pass_rate_samples, pass_rate_temperature
        self.easy_min, self.hard_max = easy_min, hard_max

    def _record(self, row: object, where: str) -> Prompt:
        if isinstance(row, BadRow):
            raise row
        if not isinstance(row, dict):
            raise BadRow(f"{where}: expected an object with columns, got {type(row).__name__}")
        c = self.columns
        values, context = {}, None
        if isinstance(row.get(c["question"]), list):  # TRL's conversational format: a list of messages
            context, values["question"] = conversation(row[c["question"]], where, c["question"])
        for key in ("question", "answer", "solution", "difficulty"):
            name = c[key]
            if name is None or key in values:
                continue
            value = row.get(name)
            if value is None or not str(value).strip():
                raise BadRow(f"{where}: missing or empty {key} column {name!r}")
            values[key] = str(value).strip()
        answer = values["answer"]
        if self.extract is not None:
            stated = self.extract.extract(answer)
            if stated is None:
                raise BadRow(f"{where}: no final answer ({', '.join(self.extract.markers)}) in column "
                             f"{c['answer']!r}: {answer[-60:]!r}")
            answer = stated.strip()
        if not normalize(answer):
            raise BadRow(f"{where}: unusable answer {answer[:60]!r}")
        bucket = "medium"  # tiers=pass_rate: replaced by the measured bucket before training
        if self.tiers == "column":
            level = _FIRST_NUMBER.search(values["difficulty"])
            if level is None:
                raise BadRow(f"{where}: difficulty {values['difficulty'][:40]!r} holds no number")
            bucket = bucket_for_steps(float(level.group()), self.easy_max, self.medium_max)
        row_id = row.get("id") or row.get("unique_id") or where
        return Prompt(id=str(row_id), question=values["question"],
                      prompt=self.prompt_template.format(question=values["question"]), answer=answer,
                      solution=values.get("solution", values["answer"]), bucket=bucket, context=context,
                      columns={k: v for k, v in row.items() if k != c["question"]})

    def _read(self, split: str, on_bad_row: str, path: str | None = None) -> list[Prompt]:
        path = path or self.path
        return keep_good_rows(read_rows(path, split), self._record, on_bad_row, f"{path} ({split})")

    def _held_out(self, record: Prompt) -> bool:
        """A fixed share of the rows, chosen by a hash of the id: the same rows on every run and rank."""
        digest = hashlib.sha256(record.id.encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.heldout_share

    def load(self, on_bad_row: str = "raise") -> list[Prompt]:
        records = self._read(self.split, on_bad_row)
        return records if self.heldout_share is None else [r for r in records if not self._held_out(r)]

    def load_eval(self, path: str, on_bad_row: str = "raise") -> list[Prompt]:
        return self._read(self.heldout_split or self.split, on_bad_row, path)

    def load_heldout(self, on_bad_row: str = "raise") -> list[Prompt] | None:
        if self.heldout_split is not None:
            return self._read(self.heldout_split, on_bad_row)
        if self.heldout_path is not None:
            return self._read(self.split, on_bad_row, self.heldout_path)
        if self.heldout_share is not None:
            return [r for r in self._read(self.split, on_bad_row) if self._held_out(r)]
        return None  # the DataModule holds out data.heldout_per_bucket per bucket
