"""Where a training step's wall time goes: the rollout (sampling, rewards, guided rows, refill
rounds; with rollout.ahead > 0, the wait for the queued groups), the reference (masks, advantages,
the reference's and any old log-probs) and the update (the optimizer steps, and handing the new
weights to a sampler ahead).

A user whose run is slow asks this first; the answer decides what to change (fewer or shorter rows,
a faster engine, smaller minibatches). The step logs them as `time/<phase>_s` and the run summary
prints their totals.
"""

from __future__ import annotations

import time
from collections.abc import Callable

PHASES = ("rollout", "reference", "update")


class StepClock:
    """Seconds between marks, charged to named phases.

    sync: called at every mark before the time is read: on a GPU it waits for the queued kernels, so
    that a phase is charged with its own device work and not the next phase's first sync
    (`torch.cuda.synchronize`; one wait per phase, against the decode's one per token). None on a CPU.
    """

    def __init__(self, sync: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.sync, self.clock = sync, clock
        self.mark: float | None = None
        self.seconds: dict[str, float] = {}

    def start(self) -> None:
        """A new step: nothing charged yet."""
        self.seconds = {}
        self.mark = self._now()

    def lap(self, phase: str) -> None:
        """The seconds since the last mark go to `phase`."""
        if self.mark is None:
            raise RuntimeError("StepClock.lap before start")
        now = self._now()
        self.seconds[phase] = now - self.mark
        self.mark = now

    def take(self) -> dict[str, float]:
        """This step's {phase: seconds}; the clock stops until the next start."""
        seconds, self.seconds, self.mark = self.seconds, {}, None
        return seconds

    def _now(self) -> float:
        if self.sync is not None:
            self.sync()
        return self.clock()


def phase_line(totals: dict[str, float], steps: int) -> str:
    """`rollout 16.1, reference 4.2, update 11.3 s/step` from a run's total seconds per phase."""
    if not steps or not totals:
        return ""
    return ", ".join(f"{p} {totals[p] / steps:.1f}" for p in PHASES if p in totals) + " s/step"
