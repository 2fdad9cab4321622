"""Feeds the curriculum the rank-averaged reward and informative-group share of each step and logs
what it drew.

curriculum/weight/easy|medium|hard   the schedule's bucket weights for the step just trained
curriculum/bucket                    the bucket that step drew (0 easy, 1 medium, 2 hard)
"""

from __future__ import annotations

import lightning as L
import torch

from grpo_aug.algo.group_stats import counted_mean, informative_share
from grpo_aug.data.records import BUCKETS
from grpo_aug.report import StepReport


class CurriculumMonitor(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        report: StepReport = outputs["report"]
        datamodule = trainer.datamodule
        if datamodule is None:
            return
        step = trainer.global_step // pl_module.algo.updates_per_rollout - 1  # the sampler step just trained
        weights = datamodule.schedule.weights(step, datamodule.total_steps)
        # averaged over ranks: an adaptive or bandit schedule must move the same way everywhere
        signal = torch.stack([counted_mean(report.rewards, report.scored),
                              informative_share(report.rewards, report.counted)]).float()  # [2]
        reward, informative = trainer.strategy.reduce(signal, reduce_op="mean").tolist()
        datamodule.schedule.observe(step, report.bucket, reward, informative)
        values = {f"curriculum/weight/{b}": w for b, w in weights.items()}
        values["curriculum/bucket"] = float(BUCKETS.index(report.bucket))
        for logger in trainer.loggers:
            logger.log_metrics(values, step=trainer.global_step)

