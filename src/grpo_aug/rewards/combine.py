"""The configured reward: a weighted sum of reward functions over a [B, G] grid of completions.

A function is called per row, (prompt record, completion) -> float | None, or, when it is batched
(a `TRLReward`: a function written for TRL's GRPOTrainer), once per step with every row, returning
a list with one float or None per row. None means it cannot score a completion. An unscorable row gets
advantage 0 and is left out of its group's mean and std; it is never turned into a 0 score.
A function that raises either stops the step with an error naming it and the prompt
(`on_error: raise`, the default) or, with `on_error: skip`, makes the rows of that call unscorable,
counted in `reward/errors/<name>`. With `timeout_s` set, every call runs in a child process with
that deadline (grpo_aug.rewards.worker); a call past it makes its rows unscorable, counted in
`reward/timeouts/<name>`, and the run goes on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from grpo_aug.data.records import Prompt
from grpo_aug.errors import UsageError
from grpo_aug.rewards.overlong import overlong_penalty
from grpo_aug.rewards.trl import TrainerState
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
    """One entry of `reward.functions`: a callable (prompt, completion) -> float | None, or a
    batched one (`fn.batched`, e.g. a TRLReward).

    weight: its share of the total reward (>= 0; 0 for a pure filter).
    min_score: when set, a row scoring below it is filtered out of the loss and group statistics.
    """

    def __init__(self, fn: Callable[[Prompt, str], float | None], weight: float = 1.0,
                 min_score: float | None = None, name: str | None = None) -> None:
        self.fn = fn
        self.weight = float(weight)
        self.min_score = None if min_score is None else float(min_score)
        self.name = name or getattr(fn, "name", type(fn).__name__)
        self.batched = bool(getattr(fn, "batched", False))


class Scores(NamedTuple):
    total: torch.Tensor  # [B, G] weighted sum; 0 where not scored
    scored: torch.Tensor  # [B, G] bool, every function returned a number
    kept: torch.Tensor  # [B, G] bool, scored and at or above every min_score
    parts: dict[str, torch.Tensor]  # per function, [B, G] raw scores, NaN where unscorable
    errors: dict[str, int]  # per function, rows left unscored by a call that raised (on_error: skip)
    timeouts: dict[str, int]  # per function, rows left unscored by a call past reward.timeout_s

    def with_part(self, name: str, values: torch.Tensor, counts: Sequence[int], weight: float) -> Scores:
        """One more weighted part, from outside the reward functions (an environment's own
        reward): values [sum counts], group after group, NaN where a row has none (unscorable)."""
        B, G = self.total.shape
        present = torch.tensor([[g < c for g in range(G)] for c in counts])  # [B, G]
        part = torch.full((B, G), math.nan).masked_scatter(present, values.float().cpu())  # [B, G]
        scored = self.scored & ~part.isnan()
        total = torch.where(scored, self.total + weight * torch.nan_to_num(part, nan=0.0), torch.zeros_like(self.total))
        return Scores(total, scored, self.kept & scored, {**self.parts, name: part}, {**self.errors, name: 0},
                      {**self.timeouts, name: 0})


class RewardSet:
    def __init__(self, functions: Sequence[RewardFunction], on_error: str = "raise",
                 timeout_s: float | None = None, overlong_buffer: int = 0, overlong_penalty: float = 1.0) -> None:
        if not functions:
            raise UsageError("reward.functions is empty: at least one reward function is needed")
        if on_error not in ON_ERROR:
            raise UsageError(f"reward.on_error must be one of {ON_ERROR}, got {on_error!r}")
        names = set()
        for i, rf in enumerate(functions):
            if not math.isfinite(rf.weight) or rf.weight < 0:
                raise UsageError(f"reward.functions[{i}].weight must be a finite number >= 0, got {rf.weight}")
            if rf.name in names:
                raise UsageError(f"reward.functions[{i}]: the name {rf.name!r} is used twice; set `name:`")
            names.add(rf.name)
        self.functions = list(functions)
        self.on_error = on_error
        if overlong_buffer < 0 or overlong_penalty < 0:
            raise UsageError(f"reward.overlong_buffer and reward.overlong_penalty must be >= 0, got "
                             f"{overlong_buffer} and {overlong_penalty}")
        self.overlong_buffer, self.overlong_penalty = int(overlong_buffer), float(overlong_penalty)
        self.timed = None if timeout_s is None else TimedCalls([rf.fn for rf in self.functions], timeout_s)

    @property
    def batched(self) -> bool:
        """Does a function take the whole batch (and so the completions' token ids)?"""
        return any(rf.batched for rf in self.functions)

    def length_shaping(self, lengths: torch.Tensor, max_len: int) -> torch.Tensor:
        """[N] the overlong term of each row's reward, from its completion length [N] (0: off)."""
        return overlong_penalty(lengths, max_len, self.overlong_buffer, self.overlong_penalty)

    def score(self, prompts: Sequence[Prompt], completions: Sequence[Sequence[str]],
              completion_ids: Sequence[Sequence[int]] | None = None, state: TrainerState | None = None,
              conversations: Sequence[list[dict] | None] | None = None) -> Scores:
        """prompts [B], completions [B][G_b] (groups may differ in size: G is the largest, and
        a group's missing rows are unscored); what batched functions also receive: completion_ids
        [sum G_b] token id lists (needed only when one is configured), the trainer state, and per
        prompt [B] the messages the model saw when the chat template rendered it (None: text)."""
        B, G = len(prompts), max(len(row) for row in completions)
        present = torch.tensor([[g < len(row) for g in range(G)] for row in completions])  # [B, G]
        total = torch.zeros(B, G)  # [B, G]
        scored = present.clone()  # [B, G]
        kept = torch.ones(B, G, dtype=torch.bool)  # [B, G]
        parts, errors, timeouts = {}, {}, {}
        for i, rf in enumerate(self.functions):
            errors[rf.name] = timeouts[rf.name] = 0
            if rf.batched:
                values = self._call_batch(i, rf, prompts, completions, completion_ids, state, conversations, errors,
                                          timeouts)
            else:
                values = [self._call(i, rf, prompt, text, errors, timeouts)
                          for prompt, row in zip(prompts, completions, strict=True) for text in row]
            scores = torch.full((B, G), math.nan)  # [B, G]
            scores[present] = torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float32)
            ok = ~scores.isnan()
            scored &= ok
            if rf.min_score is not None:
                kept &= ok & (scores >= rf.min_score)
            total += rf.weight * torch.nan_to_num(scores, nan=0.0)
            parts[rf.name] = scores
        total = torch.where(scored, total, torch.zeros_like(total))
        return Scores(total, scored, kept & scored, parts, errors, timeouts)

    def _call_batch(self, index: int, rf: RewardFunction, prompts: Sequence[Prompt],
                    completions: Sequence[Sequence[str]], completion_ids: Sequence[Sequence[int]] | None,
                    state: TrainerState | None, conversations: Sequence[list[dict] | None] | None,
                    errors: dict[str, int], timeouts: dict[str, int]) -> list:
        """One call with every row; what it returns, checked, or None for every row of a failed call."""
        rows = [p for p, row in zip(prompts, completions, strict=True) for _ in row]  # [B*G]
        texts = [t for row in completions for t in row]  # [B*G]
        if completion_ids is None:
            raise UsageError(f"reward function {rf.name!r} is batched and takes completion_ids; none were given")
        chats = None if conversations is None else [c for c, row in zip(conversations, completions, strict=True)
                                                    for _ in row]  # [B*G]
        args = (rows, texts, completion_ids, state or TrainerState(0, 0), chats)
        where = f"the step's {len(rows)} rows"
        value = self._guarded(index, rf, args, where, len(rows), errors, timeouts)
        if value is _FAILED:
            return [None] * len(rows)
        if not isinstance(value, list | tuple) or len(value) != len(rows):
            raise TypeError(f"reward function {rf.name!r} returned {str(value)[:80]!r} for {where}; expected a "
                            f"list of {len(rows)} floats or None")
        return [_checked(v, rf.name, f"row {k} of {where}") for k, v in enumerate(value)]

    def _call(self, index: int, rf: RewardFunction, prompt: Prompt, text: str, errors: dict[str, int],
              timeouts: dict[str, int]) -> float | None:
        where = f"prompt {prompt.id!r}"
        value = self._guarded(index, rf, (prompt, text), where, 1, errors, timeouts)
        return None if value is _FAILED else _checked(value, rf.name, where)

    def _guarded(self, index: int, rf: RewardFunction, args: tuple, where: str, rows: int, errors: dict[str, int],
                 timeouts: dict[str, int]) -> object:
        """The call's result, or _FAILED after a timeout or (on_error: skip) a raise, counted per row."""
        try:
            return self._run(index, rf, args)
        except RewardTimeout:
            if timeouts[rf.name] == 0:
                log.warning("reward function %r took over reward.timeout_s=%gs on %s; unscorable",
                            rf.name, self.timed.timeout_s, where)
            timeouts[rf.name] += rows
            return _FAILED
        except Exception as err:
            if self.on_error == "raise":
                raise RuntimeError(
                    f"reward function {rf.name!r} raised on {where}: {err!r} "
                    "(reward.on_error=skip leaves such rows out of the update instead)"
                ) from err
            if errors[rf.name] == 0:
                log.warning("reward function %r raised on %s: %r; skipped", rf.name, where, err)
            errors[rf.name] += rows
            return _FAILED

    def _run(self, index: int, rf: RewardFunction, args: tuple) -> object:
        if self.timed is None:
            return rf.fn(*args)
        outcome = self.timed.call(index, *args)
        if outcome.kind == "timeout":
            raise RewardTimeout
        if outcome.kind == "error":
            raise ChildError(outcome.value)
        return outcome.value


_FAILED = object()  # a call that timed out or raised under on_error: skip


def _checked(value: object, name: str, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"reward function {name!r} returned {value!r} on {where}; expected a finite float or None")
    return float(value)
