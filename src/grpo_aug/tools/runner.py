"""Running tool calls whose arguments the policy wrote: a hostile-input boundary.

Every call runs in a daemon thread of its own and is waited for until its deadline (all the
calls of one round run at once, so a round waits at most `time_limit_s`). A call that raises
becomes an error message in the transcript and is counted; one past its deadline is abandoned,
answered with a timeout message, and left to finish on its own thread (a Python thread cannot be
killed; a daemon thread does not keep the process alive). Once `max_hung` abandoned calls are
still running, further calls are refused with an error instead of piling up threads (at most
`max_hung` plus one round's calls exist at a time). Outputs are
cut to `max_output_chars`, whatever the tool returned.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from grpo_aug.errors import UsageError


@dataclass(frozen=True)
class ToolLimits:
    time_limit_s: float = 2.0  # per call; the round moves on without it after this
    max_output_chars: int = 200  # a tool's output is cut to this many characters
    max_calls_per_row: int = 4  # a row that calls once more ends there (truncated)
    max_hung: int = 16  # abandoned calls still running; beyond it calls are refused

    def __post_init__(self) -> None:
        checks = [
            (self.time_limit_s > 0, f"rollout.tools.limits.time_limit_s must be > 0, got {self.time_limit_s}"),
            (self.max_output_chars >= 1,
             f"rollout.tools.limits.max_output_chars must be >= 1, got {self.max_output_chars}"),
            (self.max_calls_per_row >= 1,
             f"rollout.tools.limits.max_calls_per_row must be >= 1, got {self.max_calls_per_row}"),
            (self.max_hung >= 1, f"rollout.tools.limits.max_hung must be >= 1, got {self.max_hung}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)


class Outcome(NamedTuple):
    text: str  # what the transcript gets: the output, or an error message
    failed: bool  # raised, timed out, was refused or returned an error
    timed_out: bool = False


TRUNCATED = "...[cut]"


class ToolError(Exception):
    """Raised by a tool (or the protocol) to put its message in the transcript as it is."""


class _Call:
    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn, self.value, self.error, self.done = fn, None, None, threading.Event()

    def __call__(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as err:  # noqa: BLE001 - whatever a tool raises is reported, never re-raised
            self.error = err
        finally:
            self.done.set()


class ToolRunner:
    def __init__(self, limits: ToolLimits | None = None) -> None:
        self.limits = limits or ToolLimits()
        self.hung: list[_Call] = []

    def cut(self, text: str) -> str:
        m = self.limits.max_output_chars
        return text if len(text) <= m else text[: max(0, m - len(TRUNCATED))] + TRUNCATED

    def run(self, calls: Sequence[Callable[[], object]]) -> list[Outcome]:
        """Run every call at once; each one's Outcome, in order."""
        self.hung = [c for c in self.hung if not c.done.is_set()]
        started = []
        for fn in calls:
            if len(self.hung) >= self.limits.max_hung:
                started.append(None)
                continue
            call = _Call(fn)
            threading.Thread(target=call, daemon=True, name="grpo-aug-tool").start()
            started.append(call)
        deadline = time.monotonic() + self.limits.time_limit_s
        out = []
        for call in started:
            if call is None:
                out.append(Outcome(f"error: {self.limits.max_hung} earlier calls still hang; call refused", True))
                continue
            if not call.done.wait(max(0.0, deadline - time.monotonic())):
                self.hung.append(call)
                out.append(Outcome(f"error: timed out after {self.limits.time_limit_s:g} s", True, True))
            elif isinstance(call.error, ToolError):
                out.append(Outcome(self.cut(str(call.error)), True))
            elif call.error is not None:
                out.append(Outcome(self.cut(f"error: {type(call.error).__name__}: {call.error}"), True))
            else:
                out.append(Outcome(self.cut(str(call.value)), False))
        return out
