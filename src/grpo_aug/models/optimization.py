"""The optimizer and its lr schedule (`model.optimizer`, `model.lr_warmup_steps`, `model.lr_final_ratio`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from grpo_aug.algo.optim import lr_factor


@dataclass(frozen=True)
class Optimization:
    optimizer: Callable[..., torch.optim.Optimizer]  # a partial optimizer class; the parameters come later
    lr_warmup_steps: int = 0  # linear ramp over the first steps
    lr_final_ratio: float = 1.0  # linear decay to this share of the lr at the last step

    def build(self, params: Iterable[torch.nn.Parameter], total_steps: int) -> dict:
        """What LightningModule.configure_optimizers returns; total_steps 0: no decay."""
        optimizer = self.optimizer(params=list(params))
        factor = functools.partial(lr_factor, warmup=self.lr_warmup_steps, total=total_steps,
                                   final=self.lr_final_ratio)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
