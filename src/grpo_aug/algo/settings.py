"""Validated loss settings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LossSettings:
    beta: float = 0.04
    clip_eps: float = 0.2
    adv_clip: float = 10.0

    def __post_init__(self) -> None:
        if self.beta < 0:
            raise ValueError(f"algo.beta must be >= 0, got {self.beta}")
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"algo.clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.adv_clip <= 0:
            raise ValueError(f"algo.adv_clip must be > 0, got {self.adv_clip}")
