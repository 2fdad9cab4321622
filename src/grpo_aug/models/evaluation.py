"""Held-out evaluation per difficulty bucket, summed over every rank's batches: greedy accuracy,
and with `eval.samples=k` (k >= 2) sampled pass@k (a prompt counts if any of its k samples is
right) and mean@k (the share of right samples). The same evaluation runs every
trainer.val_check_interval in training and alone in `mode=eval`.

Sampling draws from its own generator, seeded by (seed, step, batch), so evaluating never moves
the rollout's random stream: a run with evaluation samples what one without would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torchmetrics.aggregation import SumMetric

from grpo_aug.data.records import BUCKETS, Prompt
from grpo_aug.engines.sampling_options import SamplingOptions
from grpo_aug.errors import UsageError
from grpo_aug.rewards import AnswerFormat, MathReward


@dataclass(frozen=True)
class EvalSettings:
    samples: int = 1  # k sampled completions per prompt for pass@k and mean@k; 1: greedy only
    temperature: float = 1.0
    top_p: float = 1.0
    limit: int | None = None  # mode=eval: the first `limit` problems of the evaluation file

    def __post_init__(self) -> None:
        checks = [
            (self.samples >= 1, f"eval.samples must be >= 1, got {self.samples}"),
            (self.temperature > 0, f"eval.temperature must be > 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"eval.top_p must be in (0, 1], got {self.top_p}"),
            (self.limit is None or self.limit >= 1, f"eval.limit must be >= 1 or null, got {self.limit}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)


class HeldoutAccuracy(torch.nn.Module):
    def __init__(self, answer: AnswerFormat | None = None, settings: EvalSettings | None = None,
                 max_new_tokens: int | None = None) -> None:
        super().__init__()
        self.settings = settings or EvalSettings()
        self.max_new_tokens = max_new_tokens  # model.eval_max_new_tokens; None: the rollout's budget
        names = ["correct", "total"] + (["passed", "right_samples"] if self.settings.samples > 1 else [])
        self.sums = torch.nn.ModuleDict({f"{n}_{b}": SumMetric() for n in names for b in BUCKETS})
        self.exact = MathReward(answer=answer)

    def evaluate(self, engine, policy: torch.nn.Module, tokenizer, texts: list[str], batch: list[Prompt],
                 max_new_tokens: int, seed: int, device: torch.device,
                 all_done: Callable[[bool], bool] | None = None, counted: bool = True,
                 options: SamplingOptions | None = None) -> None:
        """One single-bucket batch: `texts` are its model inputs (prompt format applied), sampled
        by the run's engine (rollout/engine; synced to the policy by the caller) with the run's
        sampling options (stop strings, repetition penalty, top-k, min-p).
        all_done: under sharded weights, the decode loop's cross-rank vote (see rollout.sampling);
        counted=False: generate (the other ranks' forwards need this one) but add nothing."""
        greedy = engine.generate(policy, tokenizer, texts, torch.zeros(len(batch)), 1.0, max_new_tokens,
                                 all_done=all_done, options=options, records=batch)
        right = torch.tensor([self.exact(p, t) for p, t in zip(batch, greedy.texts, strict=True)])  # [B]
        adds = [("correct", right.sum()), ("total", torch.tensor(float(len(batch))))]
        k = self.settings.samples
        if k > 1:
            generator = torch.Generator(device=next(policy.parameters()).device).manual_seed(seed)
            temps = torch.full((len(batch) * k,), self.settings.temperature)
            sampled = engine.generate(policy, tokenizer, [t for t in texts for _ in range(k)], temps,
                                      self.settings.top_p, max_new_tokens, generator=generator, all_done=all_done,
                                      options=options, records=[r for r in batch for _ in range(k)])
            scores = torch.tensor([self.exact(batch[i // k], t) for i, t in enumerate(sampled.texts)])
            scores = scores.view(len(batch), k)  # [B, k]
            adds += [("passed", (scores.max(dim=1).values == 1.0).sum().float()), ("right_samples", scores.sum() / k)]
        if counted:
            for name, value in adds:
                self.sums[f"{name}_{batch[0].bucket}"].update(value.to(device))

    def compute(self) -> dict[str, float]:
        """`eval/accuracy/<bucket>` (and `eval/pass@k/<bucket>`, `eval/mean@k/<bucket>`) for the
        buckets evaluated; syncs across ranks (every rank calls it), then starts afresh."""
        out, k = {}, self.settings.samples
        for metric in self.sums.values():  # a bucket no batch reached: a sum of 0, not torchmetrics' warning
            metric.update(torch.zeros((), device=metric.device))
        for bucket in BUCKETS:
            total = self.sums[f"total_{bucket}"].compute()
            if total > 0:
                out[f"eval/accuracy/{bucket}"] = (self.sums[f"correct_{bucket}"].compute() / total).item()
                if k > 1:
                    out[f"eval/pass@{k}/{bucket}"] = (self.sums[f"passed_{bucket}"].compute() / total).item()
                    out[f"eval/mean@{k}/{bucket}"] = (self.sums[f"right_samples_{bucket}"].compute() / total).item()
        for metric in self.sums.values():
            metric.reset()
        return out


def describe(metrics: dict[str, float]) -> str:
    """'greedy held-out accuracy: easy 0.260  medium 0.010 | pass@4: easy 0.500 ...' for the log."""
    names = {"accuracy": "greedy held-out accuracy"}
    parts: dict[str, list[str]] = {}
    for key, value in metrics.items():
        _, name, bucket = key.split("/")
        parts.setdefault(names.get(name, name), []).append(f"{bucket} {value:.3f}")
    return " | ".join(f"{name}: {'  '.join(values)}" for name, values in parts.items())
