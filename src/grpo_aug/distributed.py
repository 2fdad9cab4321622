"""Reductions over ranks, called on every rank, through the module's Lightning strategy (each is
the value itself outside a Trainer): what decides together under DDP and FSDP (stop votes, chunk
and micro-batch counts, the batch reward std); and the per-rank gather of Python objects (the
feed's outcomes, checkpointed per-rank state)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def first_process() -> bool:
    """Is this the run's first process, as its launcher set it up (torchrun: RANK; Lightning's
    launcher: LOCAL_RANK and NODE_RANK), before torch.distributed starts? True in a single process."""
    return all(os.environ.get(name, "0") == "0" for name in ("RANK", "LOCAL_RANK", "NODE_RANK"))


def gather_per_rank(state: object) -> list:
    """[rank 0's state, rank 1's, ...]; a collective under torch.distributed: call on every rank."""
    rank, world = rank_world()
    if world == 1:
        return [state]
    gathered: list = [None] * world
    dist.all_gather_object(gathered, state)
    return gathered


def rank_any(module, flag: bool) -> bool:
    """Is `flag` true on any rank (every rank calls this)?"""
    value = torch.tensor(float(flag), device=module.device)
    return bool(module.trainer.strategy.reduce(value, reduce_op="sum") > 0)


def rank_sum(module, values: torch.Tensor) -> torch.Tensor:
    """`values` added over ranks (themselves outside a Trainer)."""
    return _reduce(module, values, "sum")


def rank_max(module, values: torch.Tensor) -> torch.Tensor:
    """The elementwise maximum of `values` over ranks (themselves outside a Trainer)."""
    return _reduce(module, values, "max")


def _reduce(module, values: torch.Tensor, op: str) -> torch.Tensor:
    if module._trainer is None:
        return values
    return module.trainer.strategy.reduce(values.to(module.device), reduce_op=op)


def rank_mean(module, value: float) -> float:
    """The mean of `value` over ranks (itself outside a Trainer)."""
    if module._trainer is None:
        return value
    return float(module.trainer.strategy.reduce(torch.tensor(value, device=module.device), reduce_op="mean"))


class Ranks:
    """The module's reductions, lent to the stages that decide together across ranks."""

    def __init__(self, module) -> None:
        self._module = module

    @property
    def world(self) -> int:
        """The number of ranks (1 outside a Trainer)."""
        return 1 if self._module._trainer is None else self._module.trainer.world_size

    def any(self, flag: bool) -> bool:
        return rank_any(self._module, flag)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return rank_sum(self._module, values)

    def max(self, values: torch.Tensor) -> torch.Tensor:
        return rank_max(self._module, values)

    def mean(self, value: float) -> float:
        return rank_mean(self._module, value)

    def reduce(self, values: torch.Tensor, op: str) -> torch.Tensor:
        return _reduce(self._module, values, op)
