"""Ctrl-C stops a run after the step in progress, and the run ends as a finished one does: a last
evaluation, the checkpoint that `resume=auto` continues from, the policy and the summary. Without
it Lightning turns the interrupt into an exit mid-step, and everything since the last interval
checkpoint is lost (a 30-minute run with checkpoints every 100 steps kept nothing).

A second Ctrl-C stops at once, Lightning's way: the step in progress and the end-of-run files are
lost. With several ranks the decision is taken together (a rank whose signal came a moment later
must not start a step alone): one all-reduced flag a step."""

from __future__ import annotations

import logging
import signal
import threading

import lightning as L

log = logging.getLogger(__name__)


class GracefulStop(L.Callback):
    def __init__(self) -> None:
        self.requested = False
        self.previous = signal.default_int_handler  # the SIGINT handler before fit, back after the first Ctrl-C
        self.installed = False

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # signal handlers can only be set from the main thread (a notebook's worker thread cannot)
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGINT, self.request)
            # None: a handler not set from Python; the interpreter's own raises KeyboardInterrupt
            self.previous = previous if previous is not None else signal.default_int_handler
            self.installed = True

    def request(self, signum: int, frame: object) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self.previous)
        log.warning("Ctrl-C: stopping after this step, then a last evaluation, the checkpoint, the policy "
                    "and the summary (Ctrl-C again stops at once, and those are lost)")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        if trainer.strategy.reduce_boolean_decision(self.requested, all=False):
            if not trainer.should_stop:
                log.warning("stopped by Ctrl-C after step %d of %d", trainer.global_step, trainer.max_steps)
            trainer.should_stop = True

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.installed and not self.requested:
            signal.signal(signal.SIGINT, self.previous)
        self.installed = False
