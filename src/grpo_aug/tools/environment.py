"""Multi-turn environments (`rollout/tools=environment`): a task that answers every turn of the
policy, beyond tools that answer calls.

An environment is any object a zero-argument factory (`rollout.tools.factory`, an import path,
e.g. a class) returns, one per row, with

    reset(record) -> str                the observation before the policy's first turn ("" for none);
                                        record is the row's data/records.Prompt
    step(action) -> (str, bool)         the policy's turn (its text up to a stop string) -> the
                                        observation that follows it, and whether the episode ended
    reward() -> float | None            optional: the episode's reward, added to the row's total
                                        with weight `rollout.tools.reward_weight` (as the reward
                                        part `environment`; None: the row is unscorable)

Observations are spliced in as tokens the policy did not write (no loss), exactly like a tool's
answer; every reset and step runs under the tool limits (time, output length, turns per row as
`max_calls_per_row`). A reset or step that raises or hangs puts its error in the transcript and
ends the row: the environment's state is unknown after it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from grpo_aug.errors import UsageError
from grpo_aug.tools.protocol import import_function
from grpo_aug.tools.runner import Outcome, ToolLimits, ToolRunner


class EnvironmentTools:
    active = True

    def __init__(self, factory: str, stop: Sequence[str] = ("\n",), max_transcript_tokens: int = 256,
                 reward_weight: float = 1.0, limits: ToolLimits | None = None) -> None:
        if not stop or not all(isinstance(s, str) and s for s in stop):
            raise UsageError(f"rollout.tools.stop must be a non-empty list of non-empty strings, got {list(stop)!r}")
        if max_transcript_tokens < 1:
            raise UsageError(f"rollout.tools.max_transcript_tokens must be >= 1, got {max_transcript_tokens}")
        self.factory_path = factory
        self.factory = import_function(factory, "rollout.tools.factory")
        self.turn_ends = tuple(stop)
        self.max_transcript_tokens = max_transcript_tokens
        self.reward_weight = float(reward_weight)
        self.runner = ToolRunner(limits or ToolLimits())

    @property
    def stop(self) -> tuple[str, ...]:
        return self.turn_ends

    def bind(self, tokenizer, prompt_format) -> EnvironmentTools:
        return self

    def describe(self) -> str:
        return f"environment {self.factory_path}, turns end at {list(self.turn_ends)!r}"

    def session(self, records, n: int) -> Episodes:
        if records is None:
            raise UsageError("rollout/tools=environment: the engine was called without the rows' records "
                             "(environments reset from them)")
        return Episodes(self, records)


class Episodes:
    """One environment per row for one generate call."""

    def __init__(self, tools: EnvironmentTools, records) -> None:
        self.tools, self.records = tools, list(records)
        self.envs = [tools.factory() for _ in self.records]
        self.done = [False] * len(self.envs)

    def opening(self) -> list[Outcome]:
        """Each row's reset observation (an error ends the row)."""
        out = self.tools.runner.run([functools.partial(env.reset, record)
                                     for env, record in zip(self.envs, self.records, strict=True)])
        for r, outcome in enumerate(out):
            self.done[r] = outcome.failed
        return out

    def requests(self, rows: Sequence[int], segments: Sequence[str]) -> list[Callable[[], object] | None]:
        return [functools.partial(self._step, r, s) for r, s in zip(rows, segments, strict=True)]

    def _step(self, row: int, action: str) -> str:
        observation, done = self.envs[row].step(action)
        self.done[row] = bool(done)
        return "" if observation is None else str(observation)

    role = "environment"

    def answer(self, row: int, outcome: Outcome) -> tuple[str, bool]:
        """The text spliced after the turn, and whether the row ends (the episode did, or its state
        is unknown after a failed step)."""
        return outcome.text, self.done[row] or outcome.failed

    def rewards(self) -> list[float | None] | None:
        if not self.envs or not hasattr(self.envs[0], "reward"):
            return None
        return [None if (v := env.reward()) is None else float(v) for env in self.envs]
