"""The prompt record every part of the trainer passes around."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

BUCKETS = ("easy", "medium", "hard")
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Prompt:
    """One problem. `prompt` is the text the model sees; `question` the bare problem.

    `answer` is the normalised final number; `solution` a GSM8K-style worked solution
    (`<<12*3=36>>36 ... #### 36`) that process rewards and variants read. A variant made from
    another record keeps that record's id in `source_id`.

    A conversational row (TRL's format: a list of `{role, content}` messages) keeps the messages
    before its last user message in `context`, as (role, content) pairs (maybe none); `prompt` is
    that last user message. `context` is None for a text prompt. `columns` holds a dataset row's
    columns as read, for reward functions that take them as keyword arguments (None for records
    built here, and for variants, whose columns would be stale).
    """

    id: str
    question: str
    prompt: str
    answer: str
    solution: str
    bucket: str
    source_id: str | None = None
    context: tuple[tuple[str, str], ...] | None = None
    columns: Mapping[str, object] | None = field(default=None, compare=False, hash=False, repr=False)

    def messages(self, text: str | None = None) -> list[dict[str, str]]:
        """The conversation as messages, ending with `text` (default: the prompt) as the user's."""
        return [*({"role": r, "content": c} for r, c in self.context or ()),
                {"role": "user", "content": self.prompt if text is None else text}]
