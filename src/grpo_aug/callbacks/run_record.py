"""What the end-of-run summary needs from the fit: every held-out evaluation (the step-0 baseline
included), the seconds spent building the model (tiny model and warm-up), training and
evaluating, and the training steps' seconds per phase (grpo_aug/step_clock.py). Checkpointed, so a
resumed run's summary covers the whole run, from its first baseline."""

from __future__ import annotations

import time

import lightning as L


class RunRecord(L.Callback):
    def __init__(self) -> None:
        self.evaluations: list[tuple[int, dict[str, float]]] = []  # (optimizer step, eval/* values)
        self.warmup_seconds = 0.0  # the base model and its warm-up, built or found in the cache
        self.eval_seconds = 0.0
        self.train_seconds = 0.0  # fit's wall time, evaluations inside it excluded
        self.eval_began: float | None = None
        self.train_began: float | None = None
        self.eval_in_fit = 0.0
        self.phase_seconds: dict[str, float] = {}  # rollout / reference / update, summed over the steps

    def add_warmup(self, seconds: float) -> None:
        self.warmup_seconds += seconds

    def on_validation_start(self, trainer, pl_module) -> None:
        self.eval_began = time.monotonic()

    def on_validation_end(self, trainer, pl_module) -> None:
        seconds = time.monotonic() - self.eval_began
        self.eval_seconds += seconds
        if self.train_began is not None:
            self.eval_in_fit += seconds
        last = getattr(pl_module, "last_eval", None)
        if last and not trainer.sanity_checking:
            self.evaluations.append((trainer.global_step, dict(last)))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        for phase, seconds in ((outputs or {}).get("seconds") or {}).items():
            self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + seconds

    def on_train_start(self, trainer, pl_module) -> None:
        self.train_began, self.eval_in_fit = time.monotonic(), 0.0

    def on_train_end(self, trainer, pl_module) -> None:
        self.train_seconds += time.monotonic() - self.train_began - self.eval_in_fit
        self.train_began = None

    def state_dict(self) -> dict:
        # a checkpoint is written mid-fit: the seconds so far count, as of now
        train = self.train_seconds
        if self.train_began is not None:
            train += time.monotonic() - self.train_began - self.eval_in_fit
        return {"evaluations": [[s, v] for s, v in self.evaluations], "eval_seconds": self.eval_seconds,
                "train_seconds": train, "warmup_seconds": self.warmup_seconds,
                "phase_seconds": dict(self.phase_seconds)}

    def load_state_dict(self, state: dict) -> None:
        self.evaluations = [(int(s), dict(v)) for s, v in state["evaluations"]]
        self.eval_seconds = float(state["eval_seconds"])
        self.train_seconds = float(state["train_seconds"])
        # checkpoints written before the phases were timed have none
        self.phase_seconds = {k: float(v) for k, v in state.get("phase_seconds", {}).items()}
        # this process's own model build was added before the checkpoint was read
        self.warmup_seconds += float(state["warmup_seconds"])
