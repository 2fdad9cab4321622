"""Every rank runs the same forwards and backwards, whatever its rows.

Under FSDP2 every forward and backward of a sharded model is a collective (the layers' weights
are all-gathered for the forward and again for the backward, their gradients reduce-scattered);
under DDP every backward is (the gradient all-reduce). A rank must therefore make as many model
calls as every other, in the same order, even when the zero-std filter left it no group, a
minibatch slice holds none of its rows, or it has fewer rows than another rank has parts. The
update follows one rule, here, where it scores rows (`Scorer.logprobs`, `PolicyUpdate.update`):

  1. the parts (length chunks x micro-batches) are decided over ranks (`Scorer.chunks`): as many
     on every rank, some perhaps empty;
  2. an empty part runs the step's stand-in row (row 0 of the update's rollout), weighted 0;
  3. the update's rollout always has a row 0: its first row, or, when no group entered the update
     on this rank, the rollout's first row with no loss token (`PolicyUpdate.prepare`);
  4. every part's backward runs, a non-finite one too: the skip vote that follows skips the
     optimizer step on every rank, so its gradients are never applied;
  5. a scoring call's number of forwards never depends on the data under sharded weights
     (`fast_llama.logprobs`).

Generation follows the same rule at its own depth: decode steps, refill rounds and held-out
batches are voted over ranks (`engines/sampling.py`, `rollout/groups.py`, `prompts/datamodule.py`).
"""

from __future__ import annotations

import torch


def stand_in(device: torch.device | None = None) -> torch.Tensor:
    """[1] the row an empty part runs on: row 0, which every step's update rollout has."""
    return torch.zeros(1, dtype=torch.long, device=device)


def lockstep(rows: torch.Tensor, part: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The rows a part runs (`rows[part]`), and the weight of its loss: 1, or 0 for an empty part,
    which runs the stand-in row so that its forward and backward still pair with other ranks'."""
    if len(part):
        return rows[part], 1.0
    return stand_in(rows.device), 0.0
