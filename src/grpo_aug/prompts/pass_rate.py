"""Tiers by measured pass rate (`data.source.tiers=pass_rate`): before training, the starting
policy samples k completions of every prompt, and each prompt's share of exact answers puts it in
a bucket: >= easy_min easy, <= hard_max hard, else medium. The counts are logged, with the prompts
no sample solved (hopeless for this policy today) and those every sample solved (trivial): the
two kinds of prompt that give GRPO flat groups.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence

import torch

from grpo_aug.data.records import Prompt

log = logging.getLogger(__name__)


def tier(rate: float, easy_min: float, hard_max: float) -> str:
    return "easy" if rate >= easy_min else "hard" if rate <= hard_max else "medium"


@torch.no_grad()
def pass_rates(engine, policy: torch.nn.Module, tokenizer, prompt_format: Callable[..., list[str]],
               correct: Callable[[Prompt, str], float], records: Sequence[Prompt], samples: int,
               temperature: float, max_new_tokens: int, prompts_per_batch: int = 16, seed: int = 0) -> list[float]:
    """Each record's share of `samples` completions (at `temperature`, from the run's rollout
    engine) that `correct` scores 1."""
    generator = torch.Generator(device=next(policy.parameters()).device).manual_seed(seed)
    rates = []
    for i in range(0, len(records), prompts_per_batch):
        batch = records[i : i + prompts_per_batch]
        texts = prompt_format([r.prompt for r in batch for _ in range(samples)],
                              [r.context for r in batch for _ in range(samples)])
        temps = torch.full((len(texts),), float(temperature))
        ro = engine.generate(policy, tokenizer, texts, temps, 1.0, max_new_tokens, generator=generator,
                             records=[r for r in batch for _ in range(samples)])
        for j, record in enumerate(batch):
            rows = ro.texts[j * samples : (j + 1) * samples]
            rates.append(sum(correct(record, text) == 1.0 for text in rows) / samples)
    return rates


def report(rates: Sequence[float], buckets: Sequence[str], what: str) -> Counter:
    counts = Counter(buckets)
    hopeless, trivial = sum(r == 0 for r in rates), sum(r == 1 for r in rates)
    log.info("data.source.tiers=pass_rate (%s, %d prompts): easy %d  medium %d  hard %d; no sample right: %d, "
             "every sample right: %d", what, len(rates), counts["easy"], counts["medium"], counts["hard"],
             hopeless, trivial)
    return counts


def retier_by_pass_rate(measure: Callable[[list[Prompt], int, float], list[float]], datamodule) -> None:
    """Measure every training and held-out prompt with `measure(records, samples, temperature)`
    (the module's starting policy and answer format) and give the DataModule the buckets."""
    source = datamodule.source
    train, heldout = datamodule.train_records, datamodule.heldout_records
    rates = measure(train + heldout, source.pass_rate_samples, source.pass_rate_temperature)
    buckets = [tier(rate, source.easy_min, source.hard_max) for rate in rates]
    report(rates[: len(train)], buckets[: len(train)], "training")
    report(rates[len(train) :], buckets[len(train) :], "held-out")
    datamodule.retier({r.id: b for r, b in zip(train + heldout, buckets, strict=True)})
