"""Reward calls with a deadline: `reward.timeout_s` runs each call in a child process.

A reward function is user code fed with policy output, and a Python call cannot be interrupted
from outside: a catastrophic regex holds the interpreter in C code, where neither a thread nor a
signal handler gets control. A process can be killed. The child is forked once (it inherits the
reward functions, so they need not pickle) and answers one call at a time over a pipe; a call that
misses its deadline gets the child killed and a fresh one forked for the next call. The cost is
one pipe round trip per call (tens of microseconds), so it is off by default.

Reward functions that run here must not use the GPU: a forked child cannot use CUDA.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from collections.abc import Callable, Sequence
from typing import NamedTuple

from grpo_aug.errors import UsageError


class Outcome(NamedTuple):
    kind: str  # "ok" | "error" | "timeout"
    value: object  # the returned value, or the error's repr


def _serve(conn, functions: Sequence[Callable[..., object]], inherited=None) -> None:
    # a forked child holds a copy of the parent's end of the pipe, which would keep the pipe open
    # after the parent died: closed here, a parent that ends any way (SIGKILL too) ends the child
    if inherited is not None:
        inherited.close()
    # forked inside fit, the child inherits the trainer's handlers: Lightning's SIGTERM handler only
    # logs, so the parent's exit (which terminates daemon children, then joins them) waited forever.
    # A terminal's Ctrl-C reaches the whole process group: the parent decides when the child ends
    # (callbacks/graceful_stop.py finishes the step, which still needs its rewards)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the parent went away
            return
        index, args = message
        try:
            conn.send(Outcome("ok", functions[index](*args)))
        except Exception as err:  # reported to the parent, which applies reward.on_error
            conn.send(Outcome("error", repr(err)))


class TimedCalls:
    def __init__(self, functions: Sequence[Callable[..., object]], timeout_s: float) -> None:
        if not timeout_s > 0:
            raise UsageError(f"reward.timeout_s must be > 0 or null, got {timeout_s}")
        self.functions = list(functions)
        self.timeout_s = float(timeout_s)
        methods = mp.get_all_start_methods()
        self.context = mp.get_context("fork" if "fork" in methods else "spawn")
        self.process = None
        self.conn = None

    def call(self, index: int, *args: object) -> Outcome:
        """functions[index](*args) in the child: a row's (prompt, text), or a batched call's arguments."""
        if self.process is None or not self.process.is_alive():
            self._start()
        self.conn.send((index, args))
        if self.conn.poll(self.timeout_s):
            return self.conn.recv()
        self.close()  # stuck: the next call gets a fresh child
        return Outcome("timeout", None)

    def _start(self) -> None:
        parent, child = self.context.Pipe()
        inherited = parent if self.context.get_start_method() == "fork" else None
        self.process = self.context.Process(target=_serve, args=(child, self.functions, inherited), daemon=True,
                                            name="grpo-aug-reward")
        self.process.start()
        child.close()
        self.conn = parent

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join()
            self.conn.close()
        self.process = self.conn = None

    def __getstate__(self) -> dict:  # a RewardSet may be copied or pickled; the child stays with its owner
        return {**self.__dict__, "process": None, "conn": None}
