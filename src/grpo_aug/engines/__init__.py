"""Rollout engines (`rollout/engine=...`): what samples the completions, behind one interface.

An engine takes the rows' prompts with per-row sampling settings (temperature, top-p, token
budget, the options of engines/sampling_options.py and a random stream for the batch) and returns a Rollout
(engines/types.py): token ids, masks, texts and, when it has them, its log-prob of each sampled
token (`rollout/logprob_gap` compares them with the trainer's). The group stage (rollout/)
uses engines only through `Engine`; nothing here imports it.

    hf              hf.py: the policy samples itself (sampling.py, the lean decode loop where the
                    model allows); nothing to load or sync
    vllm            vllm_colocated.py: vLLM in the trainer's process, weights written in before
                    each rollout that follows an optimizer step (weights.py)
    vllm_server     vllm_server.py: a separate `vllm serve` over HTTP; weight_sync.py pushes the
                    weights to it
    multi-turn      turns.py: wraps any of them with a tool or an environment between rounds
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from grpo_aug.engines.sampling_options import SamplingOptions
from grpo_aug.engines.types import Rollout


class Engine(Protocol):
    name: str
    external: bool  # other kernels than the trainer's: algo/engine_correction weighs its rows

    def setup(self, name_or_path: str, tokenizer, seed: int) -> None:
        """Load what the engine needs (once; the policy's path or name and the run's seed)."""

    def sync(self, policy: torch.nn.Module, step: int) -> None:
        """Sample from the policy's current weights from here on (once per optimizer step)."""

    def generate(self, policy: torch.nn.Module, tokenizer, texts: Sequence[str] | Sequence[Sequence[int]],
                 temperatures: torch.Tensor, top_p: float, max_new_tokens: int,
                 generator: torch.Generator | None = None, all_done: Callable[[bool], bool] | None = None,
                 options: SamplingOptions | None = None, limits: torch.Tensor | None = None, records=None) -> Rollout:
        """Rows from prompt texts (or token ids: a multi-turn transcript so far), one temperature
        [N] and one token limit [N] (None: max_new_tokens) per row; all_done is the cross-rank
        vote of a sharded decode; records are the rows' data records (multi-turn only)."""


__all__ = ["Engine", "SamplingOptions", "Rollout"]
