"""The rollout's own random stream, one generator per rank seeded by (seed, rank): untouched by
anything else that draws (dataloader workers, evaluation) and checkpointed per rank, so a resumed
run samples what an uninterrupted one does."""

from __future__ import annotations

import torch

from grpo_aug.distributed import gather_per_rank
from grpo_aug.resume import capture_rng, own_entry, restore_rng


class RolloutStream:
    """The rollout's random generator: one per rank, seeded by (seed, rank), restored on resume."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.generator: torch.Generator | None = None
        self.restored: dict | None = None  # this rank's entry from a checkpoint, applied at train start

    def get(self, device: torch.device, rank: int) -> torch.Generator:
        if self.generator is None:
            self.generator = torch.Generator(device=device).manual_seed(self.seed * 100_003 + rank)
        return self.generator

    def state(self, device: torch.device, rank: int) -> list:
        return gather_per_rank(capture_rng(self.get(device, rank)))  # every rank calls this: it gathers

    def restore(self, device: torch.device, rank: int) -> None:
        """Late, at train start: Lightning draws from the global stream while setting up."""
        if self.restored is not None:
            rng = own_entry(self.restored, "random streams")
            if rng is not None:
                restore_rng(rng, self.get(device, rank))
            self.restored = None
