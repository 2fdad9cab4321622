"""Greedy held-out accuracy per difficulty bucket, summed over every rank's batches."""

from __future__ import annotations

import torch
from torchmetrics.aggregation import SumMetric

from grpo_aug.data.records import BUCKETS, Prompt
from grpo_aug.rewards import AnswerFormat, MathReward


class HeldoutAccuracy(torch.nn.Module):
    def __init__(self, answer: AnswerFormat | None = None) -> None:
        super().__init__()
        self.correct = torch.nn.ModuleDict({b: SumMetric() for b in BUCKETS})
        self.total = torch.nn.ModuleDict({b: SumMetric() for b in BUCKETS})
        self.exact = MathReward(answer=answer)

    def update(self, batch: list[Prompt], texts: list[str], device: torch.device) -> None:
        """One single-bucket batch of held-out prompts and their greedy completions."""
        scores = [self.exact(p, text) for p, text in zip(batch, texts, strict=True)]
        bucket = batch[0].bucket
        self.correct[bucket].update(torch.tensor(scores, device=device).sum())
        self.total[bucket].update(torch.tensor(float(len(batch)), device=device))

    def compute(self) -> dict[str, float]:
        """`eval/accuracy/<bucket>` for the buckets evaluated; syncs across ranks (every rank calls
        it), then starts afresh."""
        accuracy = {}
        for bucket in BUCKETS:
            total, correct = self.total[bucket].compute(), self.correct[bucket].compute()
            if total > 0:
                accuracy[f"eval/accuracy/{bucket}"] = (correct / total).item()
            self.total[bucket].reset()
            self.correct[bucket].reset()
        return accuracy
