"""Reward functions written for TRL's GRPOTrainer, used unchanged (`rewards.TRLReward`).

TRL calls a reward function once per batch as
    fn(prompts=[...], completions=[...], completion_ids=[[...]], **columns, trainer_state=state)
with one entry per completion (a prompt repeats for each of its group's rows) and returns a list of
floats, None where it cannot score. As in TRL, a prompt the chat template renders
(data/prompt_format=chat) is conversational: it is passed as the list of `{role, content}` messages
the model saw (the system prompt included) and each completion as
`[{"role": "assistant", "content": text}]`; a text prompt passes both as strings. Every other
dataset column arrives as a keyword argument, a list over the rows. Records built here (synthetic,
GSM8K) and prompt variants, whose dataset columns would be stale, pass their own fields instead:
`question`, `answer` (the normalised final answer), `solution`, `bucket`, `id`.

    reward.functions:
      - _target_: grpo_aug.rewards.RewardFunction
        fn: {_target_: grpo_aug.rewards.TRLReward, fn: my_rewards.correctness_reward}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hydra.utils import get_method

from grpo_aug.data.records import Prompt
from grpo_aug.errors import UsageError


@dataclass(frozen=True)
class TrainerState:
    """What of TRL's `trainer_state` a reward function may read."""

    global_step: int
    max_steps: int


def import_callable(path: str, key: str) -> Callable:
    """`package.module.name` -> that function (Hydra's own lookup), or an error naming the key."""
    if "." not in path:
        raise UsageError(f"{key}={path!r}: expected an import path such as my_rewards.correctness_reward")
    try:
        return get_method(path)
    except (ImportError, ValueError) as err:
        raise UsageError(f"{key}={path!r} cannot be imported: {err}") from err


def row_columns(prompt: Prompt) -> dict[str, object]:
    """The keyword arguments one row contributes: its dataset columns, or its own fields."""
    own = {"question": prompt.question, "answer": prompt.answer, "solution": prompt.solution,
           "bucket": prompt.bucket, "id": prompt.id}
    return own if prompt.columns is None else {**own, **prompt.columns}


class TRLReward:
    """A batched reward: the RewardSet calls it once per step with every row."""

    batched = True

    def __init__(self, fn: str | Callable) -> None:
        self.fn = import_callable(fn, "reward.functions[].fn.fn") if isinstance(fn, str) else fn
        if not callable(self.fn):
            raise UsageError(f"reward.functions[].fn.fn must be a function or an import path, got {fn!r}")
        inner = getattr(self.fn, "func", self.fn)  # a functools.partial from `_partial_: true`
        self.name = getattr(inner, "__name__", type(inner).__name__)

    def __call__(self, prompts: Sequence[Prompt], texts: Sequence[str], completion_ids: Sequence[Sequence[int]],
                 state: TrainerState, conversations: Sequence[list[dict] | None] | None = None) -> object:
        """prompts, texts, completion_ids, conversations: one entry per row (N). Returns what the
        function returns."""
        chats = conversations_of(prompts, conversations)
        rows = [row_columns(p) for p in prompts]
        keys = dict.fromkeys(k for r in rows for k in r if k not in ("prompt", "completion", "completion_ids"))
        columns = {k: [r.get(k) for r in rows] for k in keys}  # as TRL passes them: a list per column
        return self.fn(
            prompts=[p.prompt if c is None else c for p, c in zip(prompts, chats, strict=True)],
            completions=[t if c is None else [{"role": "assistant", "content": t}]
                         for t, c in zip(texts, chats, strict=True)],
            completion_ids=[list(ids) for ids in completion_ids], **columns, trainer_state=state)


def conversations_of(prompts: Sequence[Prompt], conversations: Sequence[list[dict] | None] | None,
                     ) -> list[list[dict] | None]:
    """Per row, the messages the model saw (None: a text prompt). Without the run's prompt format
    to say so, a record is a conversation when its dataset row was one."""
    if conversations is not None:
        return list(conversations)
    return [None if p.context is None else p.messages() for p in prompts]
