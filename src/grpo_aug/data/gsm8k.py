"""GSM8K-format JSONL: one {"question": ..., "answer": "... #### N"} object per line.

Difficulty is the number of `<<...>>` calculator annotations in the reference solution.
"""

from __future__ import annotations

import json
from pathlib import Path

from grpo_aug.data.records import Prompt
from grpo_aug.rewards.extract import normalize_number


def bucket_for_steps(steps: int, easy_max: int, medium_max: int) -> str:
    return "easy" if steps <= easy_max else "medium" if steps <= medium_max else "hard"


def read_gsm8k(path: str | Path, prompt_template: str, easy_max: int = 2, medium_max: int = 4) -> list[Prompt]:
    """Parse a GSM8K JSONL file; every malformed line is reported as `file:line: what`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path} (set data.source.path)")
    records = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
            for key in ("question", "answer"):
                if not isinstance(row.get(key), str) or not row[key].strip():
                    raise ValueError(f"{where}: missing or empty '{key}'")
            solution = row["answer"]
            if "####" not in solution:
                raise ValueError(f"{where}: 'answer' does not end with '#### N'")
            final = normalize_number(solution.rsplit("####", 1)[1].strip())
            if final is None:
                raise ValueError(f"{where}: final answer after '####' is not a number")
            records.append(Prompt(
                id=f"{path.stem}-{lineno}",
                question=row["question"],
                prompt=prompt_template.format(question=row["question"]),
                answer=final,
                solution=solution,
                bucket=bucket_for_steps(solution.count("<<"), easy_max, medium_max),
            ))
    if not records:
        raise ValueError(f"{path}: no records")
    return records


class GSM8KSource:
    """Train records from `path`; held-out from `heldout_path` when given, else split from `path`."""

    def __init__(self, path: str, heldout_path: str | None = None, easy_max: int = 2, medium_max: int = 4,
                 prompt_template: str = "Question: {question}\nAnswer: ") -> None:
        if not 0 <= easy_max < medium_max:
            raise ValueError(f"data.source: need 0 <= easy_max < medium_max, got {easy_max}, {medium_max}")
        self.path = path
        self.heldout_path = heldout_path
        self.easy_max = easy_max
        self.medium_max = medium_max
        self.prompt_template = prompt_template

    def load(self) -> list[Prompt]:
        return read_gsm8k(self.path, self.prompt_template, self.easy_max, self.medium_max)

    def load_heldout(self) -> list[Prompt] | None:
        if self.heldout_path is None:
            return None
        return read_gsm8k(self.heldout_path, self.prompt_template, self.easy_max, self.medium_max)
