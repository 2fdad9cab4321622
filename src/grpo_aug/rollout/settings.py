"""Validated rollout settings: checked when the config is composed, before any model loads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from grpo_aug.data.records import Prompt
from grpo_aug.engines.sampling_options import SamplingOptions
from grpo_aug.errors import UsageError
from grpo_aug.rollout.budget import UniformBudget
from grpo_aug.rollout.dedup import NoDedup
from grpo_aug.rollout.filter import GroupFilter


@dataclass(frozen=True)
class RolloutSettings:
    group_size: int = 8
    temperatures: Sequence[float] = (0.7, 1.0, 1.2, 1.5)
    top_p: float = 0.95
    max_new_tokens: int = 64
    dedup: NoDedup = field(default_factory=NoDedup)
    filter: GroupFilter = field(default_factory=GroupFilter)
    budget: UniformBudget = field(default_factory=UniformBudget)  # rows per prompt (rollout/budget.py)
    hints: Sequence[str] = ()  # method hints; slot g gets hints[g % len]; empty: off
    hint_template: str = "{question} {hint}"
    oversample: int = 1  # roll out oversample x group_size rows per prompt, keep the max-variance group_size
    top_k: int = 0  # engines/sampling_options.py: 0, 0.0, 1.0 and () are off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop: Sequence[str] = ()
    include_stop_str: bool = False
    ahead: int = 0  # rollouts requested ahead of training (update/ahead.py); 0: each step samples its own

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise UsageError(f"rollout.group_size must be >= 2 (a group needs a std), got {self.group_size}")
        if len(self.temperatures) == 0:
            raise UsageError("rollout.temperatures is empty; give at least one temperature, e.g. [1.0]")
        for i, t in enumerate(self.temperatures):
            if t < 0:
                raise UsageError(f"rollout.temperatures[{i}] = {t} is negative")
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if self.oversample < 1:
            raise UsageError(f"rollout.oversample must be >= 1, got {self.oversample}")
        if not isinstance(self.ahead, int) or self.ahead < 0:
            raise UsageError(f"rollout.ahead must be an integer >= 0 (rollouts sampled ahead of training), "
                             f"got {self.ahead!r}")
        if self.max_new_tokens < 1:
            raise UsageError(f"rollout.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "temperatures", tuple(float(t) for t in self.temperatures))
        object.__setattr__(self, "stop", tuple(self.stop))
        self.options  # noqa: B018 (validates them now, before any model loads)
        self.dedup.check_group_size(self.group_size)
        self.budget.check(self.group_size, self.oversample, self.dedup.min_unique)
        object.__setattr__(self, "hints", tuple(self.hints))
        if "{question}" not in self.hint_template or "{hint}" not in self.hint_template:
            raise UsageError(f"rollout.hint_template must contain {{question}} and {{hint}}, "
                             f"got {self.hint_template!r}")

    @property
    def options(self) -> SamplingOptions:
        return SamplingOptions(self.top_k, self.min_p, self.repetition_penalty, self.stop, self.include_stop_str)

    @property
    def rows_per_prompt(self) -> int:
        """Rows rolled out per prompt: G, or oversample x G before down-sampling."""
        return self.group_size * self.oversample

    @property
    def width(self) -> int:
        """Row slots per group once rolled out: group_size, or the budget's largest group."""
        return self.budget.width(self.group_size)

    def row_prompts(self, batch: Sequence[Prompt], counts: Sequence[int] | None = None) -> list[str]:
        """The rollout prompts, counts[b] (default rows_per_prompt) for prompt b: slot g of each
        group carries hint g % len(hints), if any.

        The hint goes into the question inside the formatted prompt; the reward still judges
        against the original record.
        """
        rows = []
        for p, count in zip(batch, counts or [self.rows_per_prompt] * len(batch), strict=True):
            for g in range(count):
                if not self.hints:
                    rows.append(p.prompt)
                    continue
                hinted = self.hint_template.format(question=p.question, hint=self.hints[g % len(self.hints)])
                rows.append(p.prompt.replace(p.question, hinted, 1))
        return rows

    def row_temperatures(self, num_prompts: int, counts: Sequence[int] | None = None) -> torch.Tensor:
        """[sum of counts] (default rows_per_prompt each): row g of every group samples at
        temperatures[g % len(temperatures)]."""
        counts = counts or [self.rows_per_prompt] * num_prompts
        return torch.tensor([self.temperatures[g % len(self.temperatures)] for c in counts for g in range(c)])
