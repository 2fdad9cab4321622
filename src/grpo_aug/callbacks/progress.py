"""The GRPO progress line, in place of Lightning's bar: optimizer steps to `trainer.max_steps`
(several per rollout when algo.num_iterations or algo.minibatches > 1), never an epoch count, with
ETA, s/step, the bucket the step drew, its train reward and the last held-out accuracy per bucket:

    GRPO  120/200  60%  1.07 s/step  ETA 1:25  bucket medium  reward 0.62  eval@100 easy 0.81 medium 0.54 hard 0.47

Rank 0 only. Not a terminal: a log line every `log_every_s` seconds and at the last step.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar

from grpo_aug.data.records import BUCKETS
from grpo_aug.errors import UsageError
from grpo_aug.progress import Progress


def bucket_label(buckets) -> str:
    """The step's bucket, or its mix: "easy", or "easy 10 medium 4 hard 2"."""
    counts = {b: list(buckets).count(b) for b in BUCKETS if b in buckets}
    return next(iter(counts)) if len(counts) == 1 else " ".join(f"{b} {n}" for b, n in counts.items())


class StepProgress(ProgressBar):
    def __init__(self, log_every_s: float = 30.0) -> None:
        super().__init__()
        if not log_every_s > 0:
            raise UsageError(f"callbacks.progress.log_every_s must be > 0, got {log_every_s}")
        self.log_every_s = log_every_s
        self.enabled = True
        self.line: Progress | None = None
        self.eval = ""  # the last held-out accuracy, shown after the step's own fields

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.line = Progress("GRPO", trainer.max_steps, start=trainer.global_step, log_every_s=self.log_every_s,
                             enabled=self.enabled and trainer.is_global_zero)
        self.remember_eval(trainer, pl_module)  # the step-0 baseline, or a resumed run's last

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        fields = {"bucket": bucket_label(outputs["report"].buckets)}
        reward = trainer.progress_bar_metrics.get("train/reward")
        if reward is not None:
            fields["reward"] = f"{float(reward):.2f}"
        if self.eval:
            fields["eval"] = self.eval
        self.line.update(trainer.global_step, **fields)

    def on_validation_end(self, trainer, pl_module) -> None:
        self.remember_eval(trainer, pl_module)

    def remember_eval(self, trainer, pl_module) -> None:
        last = getattr(pl_module, "last_eval", None)
        if last:
            self.eval = eval_text(trainer.global_step, last)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.line is not None:
            if self.eval:  # the last step's evaluation ran after its batch
                self.line.fields["eval"] = self.eval
            self.line.close()


def eval_text(step: int, accuracy: dict[str, float]) -> str:
    """'@100 easy 0.81 medium 0.54 hard 0.47' from the eval/accuracy/<bucket> values."""
    buckets = [(k.rsplit("/", 1)[1], v) for k, v in accuracy.items() if k.startswith("eval/accuracy/")]
    return f"@{step} " + " ".join(f"{b} {v:.2f}" for b, v in buckets)
