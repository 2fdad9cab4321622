"""The prompt record every part of the trainer passes around."""

from __future__ import annotations

from dataclasses import dataclass

BUCKETS = ("easy", "medium", "hard")


@dataclass(frozen=True)
class Prompt:
    """One problem. `prompt` is the text the model sees; `question` the bare problem.

    `answer` is the normalised final number; `solution` a GSM8K-style worked solution
    (`<<12*3=36>>36 ... #### 36`) that process rewards and variants read. A variant made from
    another record keeps that record's id in `source_id`.
    """

    id: str
    question: str
    prompt: str
    answer: str
    solution: str
    bucket: str
    source_id: str | None = None
