"""The lr schedule and the gradient norm the update loop uses."""

from __future__ import annotations

import torch


def lr_factor(step: int, warmup: int, total: int, final: float = 1.0) -> float:
    """The lr multiplier at optimizer step `step`: a linear ramp over `warmup` steps (Adam's first
    updates move every weight by ~lr whatever the gradient, and early policy-gradient estimates are
    mostly noise), then linear decay to `final` at step `total` (with mu = 1 the PPO clip never
    binds, so late updates are bounded by the lr alone). total = 0: no decay."""
    ramp = min(1.0, (step + 1) / (max(warmup, 0) + 1))
    if total <= warmup or final == 1.0:
        return ramp
    progress = min(max((step - warmup) / (total - warmup), 0.0), 1.0)
    return ramp * (1.0 - (1.0 - final) * progress)


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of an FSDP2 (DTensor) weight or gradient; any other tensor as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def gradient_norm(model: torch.nn.Module) -> torch.Tensor:
    """L2 norm of this rank's gradients (its shard under FSDP/ZeRO); inf or NaN if any entry is."""
    grads = [local_shard(p.grad) for p in model.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))


def clip_gradients_(model: torch.nn.Module, max_norm: float, total_norm: float | None = None) -> None:
    """Scale the trainable gradients so that their L2 norm is at most max_norm.

    Unsharded (total_norm None): torch's clip_grad_norm_ on this rank's (replicated) gradients.
    Sharded (FSDP, ZeRO-3): each rank holds a shard; `total_norm` is the whole model's norm
    (from the rank-summed squares) and every shard is scaled by the same coefficient.
    """
    params = [p for p in model.parameters() if p.grad is not None]
    if total_norm is None:
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        return
    coef = min(1.0, max_norm / (total_norm + 1e-6))
    for p in params:
        p.grad.mul_(coef)
