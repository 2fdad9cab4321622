"""GSM8K-format JSONL: one {"question": ..., "answer": "... #### N"} object per line.

Difficulty is the number of `<<...>>` calculator annotations in the reference solution.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from grpo_aug.data.records import Prompt
from grpo_aug.data.rows import BadRow, keep_good_rows
from grpo_aug.errors import MissingFile, UsageError
from grpo_aug.mathtext import normalize_number

log = logging.getLogger(__name__)


def bucket_for_steps(steps: int, easy_max: int, medium_max: int) -> str:
    return "easy" if steps <= easy_max else "medium" if steps <= medium_max else "hard"


def _parse_row(line: str, where: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise BadRow(f"{where}: not valid JSON ({err.msg})") from None
    if not isinstance(row, dict):
        raise BadRow(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key in ("question", "answer"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise BadRow(f"{where}: missing or empty '{key}'")
    if "####" not in row["answer"]:
        raise BadRow(f"{where}: 'answer' does not end with '#### N'")
    final = normalize_number(row["answer"].rsplit("####", 1)[1].strip())
    if final is None:
        raise BadRow(f"{where}: final answer after '####' is not a number: "
                     f"{row['answer'].rsplit('####', 1)[1].strip()[:40]!r}")
    return {**row, "final": final}


def read_gsm8k(path: str | Path, prompt_template: str, easy_max: int = 2, medium_max: int = 4,
               on_bad_row: str = "raise") -> list[Prompt]:
    """Parse a GSM8K JSONL file. A malformed line, a missing field, a non-numeric final answer or
    a repeated `id` is an error naming `file:line`; with on_bad_row='skip' such lines are left out,
    counted and summarised in the log instead. A row's id is its `id` field, else `<stem>-<line>`."""
    path = Path(path)
    if not path.is_file():
        raise MissingFile(f"data file not found: {path} (set data.source.path)")

    def make(raw: tuple[int, str], where: str) -> Prompt:
        lineno, line = raw
        row = _parse_row(line, where)
        return Prompt(
            id=str(row["id"]) if row.get("id") is not None else f"{path.stem}-{lineno}",
            question=row["question"],
            prompt=prompt_template.format(question=row["question"]),
            answer=row["final"],
            solution=row["answer"],
            bucket=bucket_for_steps(row["answer"].count("<<"), easy_max, medium_max),
        )

    with path.open(encoding="utf-8") as f:
        lines = [(f"{path}:{n}", (n, line)) for n, line in enumerate(f, start=1) if line.strip()]
    return keep_good_rows(lines, make, on_bad_row, str(path))


class GSM8KSource:
    """Train records from `path`; held-out from `heldout_path` when given, else split from `path`."""

    def __init__(self, path: str, heldout_path: str | None = None, easy_max: int = 2, medium_max: int = 4,
                 prompt_template: str = "Question: {question}\nAnswer: ") -> None:
        if not 0 <= easy_max < medium_max:
            raise UsageError(f"data.source: need 0 <= easy_max < medium_max, got {easy_max}, {medium_max}")
        for key, value in (("path", path), ("heldout_path", heldout_path)):
            if value is not None and not Path(value).is_file():  # checked now, before any model is built
                raise MissingFile(f"data.source.{key}={str(value)!r}: no such file")
        self.path = path
        self.heldout_path = heldout_path
        self.easy_max = easy_max
        self.medium_max = medium_max
        self.prompt_template = prompt_template

    def load(self, on_bad_row: str = "raise") -> list[Prompt]:
        return read_gsm8k(self.path, self.prompt_template, self.easy_max, self.medium_max, on_bad_row)

    def load_eval(self, path: str, on_bad_row: str = "raise") -> list[Prompt]:
        return read_gsm8k(path, self.prompt_template, self.easy_max, self.medium_max, on_bad_row)

    def load_heldout(self, on_bad_row: str = "raise") -> list[Prompt] | None:
        if self.heldout_path is None:
            return None
        return read_gsm8k(self.heldout_path, self.prompt_template, self.easy_max, self.medium_max, on_bad_row)
