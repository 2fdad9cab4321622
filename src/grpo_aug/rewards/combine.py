"""The configured reward: a weighted sum of reward functions over a [B, G] grid of completions.

A function returns a float, or None when it cannot score a completion. An unscorable row gets
advantage 0 and is left out of its group's mean and std; it is never turned into a 0 score.
A function that raises either stops the step with an error naming it and the prompt
(`on_error: raise`, the default) or, with `on_error: skip`, makes that row unscorable and is
counted in `reward/errors/<name>`. With `timeout_s` set, every call runs in a child process with
that deadline (grpo_aug.rewards.worker); a call past it makes the row unscorable, is counted in
`reward/timeouts/<name>`, and the run goes on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from grpo_aug.data.records import Prompt
from grpo_aug.rewards.winsorize import NoWinsorize, Winsorize
from grpo_aug.rewards.worker import TimedCalls

log = logging.getLogger(__name__)
ON_ERROR = ("raise", "skip")


class RewardTimeout(Exception):
    pass


class ChildError(Exception):
    """A reward function raised inside the timed child process; the message is its repr."""

    def __repr__(self) -> str:
        return str(self)


class RewardFunction:
    """One entry of `reward.functions`: a callable (prompt, completion) -> float | None.

    weight: its share of the total reward (>= 0; 0 for a pure filter).
    min_score: when set, a row scoring below it is filtered out of the loss and group statistics.
    """

    def __init__(self, fn: Callable[[Prompt, str], float | None], weight: float = 1.0,
                 min_score: float | None = None, name: str | None = None) -> None:
        self.fn = fn
        self.weight = float(weight)
        self.min_score = None if min_score is None else float(min_score)
        self.name = name or getattr(fn, "name", type(fn).__name__)


class Scores(NamedTuple):
    total: torch.Tensor  # [B, G] weighted sum; 0 where not scored
    scored: torch.Tensor  # [B, G] bool, every function returned a number
    kept: torch.Tensor  # [B, G] bool, scored and at or above every min_score
    parts: dict[str, torch.Tensor]  # per function, [B, G] raw scores, NaN where unscorable
    errors: dict[str, int]  # per function, how many calls raised (on_error: skip)
    timeouts: dict[str, int]  # per function, how many calls missed reward.timeout_s


class RewardSet:
    def __init__(self, functions: Sequence[RewardFunction], on_error: str = "raise",
                 winsorize: Winsorize | NoWinsorize | None = None, timeout_s: float | None = None) -> None:
        if not functions:
            raise ValueError("reward.functions is empty: at least one reward function is needed")
        if on_error not in ON_ERROR:
            raise ValueError(f"reward.on_error must be one of {ON_ERROR}, got {on_error!r}")
        names = set()
        for i, rf in enumerate(functions):
            if not math.isfinite(rf.weight) or rf.weight < 0:
                raise ValueError(f"reward.functions[{i}].weight must be a finite number >= 0, got {rf.weight}")
            if rf.name in names:
                raise ValueError(f"reward.functions[{i}]: the name {rf.name!r} is used twice; set `name:`")
            names.add(rf.name)
        self.functions = list(functions)
        self.on_error = on_error
        self.winsorize = winsorize or NoWinsorize()
        self.timed = None if timeout_s is None else TimedCalls([rf.fn for rf in self.functions], timeout_s)

    def score(self, prompts: Sequence[Prompt], completions: Sequence[Sequence[str]]) -> Scores:
        shape = (len(prompts), len(completions[0]))
        total = torch.zeros(shape)  # [B, G]
        scored = torch.ones(shape, dtype=torch.bool)  # [B, G]
        kept = torch.ones(shape, dtype=torch.bool)  # [B, G]
        parts, errors, timeouts = {}, {}, {}
        for i, rf in enumerate(self.functions):
            scores = torch.full(shape, math.nan)  # [B, G]
            errors[rf.name] = timeouts[rf.name] = 0
            for b, (prompt, row) in enumerate(zip(prompts, completions, strict=True)):
                for g, text in enumerate(row):
                    value = self._call(i, rf, prompt, text, errors, timeouts)
                    if value is not None:
                        scores[b, g] = value
            ok = ~scores.isnan()
            scored &= ok
            if rf.min_score is not None:
                kept &= ok & (scores >= rf.min_score)
            total += rf.weight * torch.nan_to_num(scores, nan=0.0)
            parts[rf.name] = scores
        total = torch.where(scored, total, torch.zeros_like(total))
        return Scores(total, scored, kept & scored, parts, errors, timeouts)

    def _call(self, index: int, rf: RewardFunction, prompt: Prompt, text: str, errors: dict[str, int],
              timeouts: dict[str, int]) -> float | None:
        try:
            value = self._run(index, rf, prompt, text)
        except RewardTimeout:
            if timeouts[rf.name] == 0:
                log.warning("reward function %r took over reward.timeout_s=%gs on prompt %r; the row is unscorable",
                            rf.name, self.timed.timeout_s, prompt.id)
            timeouts[rf.name] += 1
            return None
        except Exception as err:
            if self.on_error == "raise":
                raise RuntimeError(
                    f"reward function {rf.name!r} raised on prompt {prompt.id!r}: {err!r} "
                    "(reward.on_error=skip leaves such rows out of the update instead)"
                ) from err
            if errors[rf.name] == 0:
                log.warning("reward function %r raised on prompt %r: %r; the row is skipped", rf.name, prompt.id, err)
            errors[rf.name] += 1
            return None
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise TypeError(f"reward function {rf.name!r} returned {value!r} on prompt {prompt.id!r}; "
                            "expected a finite float or None")
        return float(value)

    def _run(self, index: int, rf: RewardFunction, prompt: Prompt, text: str) -> object:
        if self.timed is None:
            return rf.fn(prompt, text)
        outcome = self.timed.call(index, prompt, text)
        if outcome.kind == "timeout":
            raise RewardTimeout
        if outcome.kind == "error":
            raise ChildError(outcome.value)
        return outcome.value
