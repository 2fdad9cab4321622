"""`rollout/engine=hf`: the policy samples itself (engines/sampling.py: batched, KV-cached, per-row
temperatures, the lean decode loop where the model allows). Nothing to load or to sync."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch

from grpo_aug.dtypes import DTYPES
from grpo_aug.engines.sampling import generate
from grpo_aug.engines.sampling_options import SamplingOptions
from grpo_aug.engines.types import Rollout
from grpo_aug.errors import UsageError
from grpo_aug.fast_llama.decode import LEAN_FLAG, sharded


class HFEngine:
    """captured_decode: on CUDA, the Llama-family decode step as one captured CUDA graph per
    rollout (fast_llama/static_decode.py: the same tokens as the eager step); ignored elsewhere.
    sample_dtype: sample from a copy of the policy whose weights are in this dtype (e.g. bfloat16:
    AMX on a CPU, half the bytes per decoded token on a GPU), overwritten from the policy before
    every rollout; None: the policy samples itself. Buffers (RoPE frequencies) keep their dtype."""

    name = "hf"
    external = False  # its log-probs come from the policy's own forward: nothing to correct

    def __init__(self, captured_decode: bool = False, sample_dtype: str | None = None) -> None:
        if sample_dtype is not None and sample_dtype not in DTYPES:
            raise UsageError(f"rollout.engine.sample_dtype must be null or one of {sorted(DTYPES)}, "
                             f"got {sample_dtype!r}")
        self.captured_decode = captured_decode
        self.sample_dtype = None if sample_dtype is None else DTYPES[sample_dtype]
        self.copy: torch.nn.Module | None = None

    def sampler(self, policy: torch.nn.Module) -> torch.nn.Module:
        """What samples: the policy, or its copy in sample_dtype with the policy's current weights."""
        dtype = self.sample_dtype
        if dtype is None or sharded(policy) or next(policy.parameters()).dtype == dtype:
            return policy
        if self.copy is None:
            self.copy = copy.deepcopy(policy).requires_grad_(False)
            # a forward a library wrapped on the instance (accelerate: autocast, outputs cast to
            # float32) would undo the copy's dtype: the copy runs its class's own forward
            for wrapped in ("forward", "_original_forward"):
                vars(self.copy).pop(wrapped, None)
            for p in self.copy.parameters():
                p.data = p.data.to(dtype)
        with torch.no_grad():
            for mine, theirs in zip(self.copy.parameters(), policy.parameters(), strict=True):
                mine.copy_(theirs)
        setattr(self.copy, LEAN_FLAG, getattr(policy, LEAN_FLAG, True))
        return self.copy

    def setup(self, name_or_path: str, tokenizer, seed: int) -> None:
        pass

    def sync(self, policy: torch.nn.Module, step: int) -> None:
        pass  # the policy is the engine

    def generate(self, policy: torch.nn.Module, tokenizer, texts: Sequence[str] | Sequence[Sequence[int]],
                 temperatures: torch.Tensor, top_p: float, max_new_tokens: int,
                 generator: torch.Generator | None = None, all_done: Callable[[bool], bool] | None = None,
                 options: SamplingOptions | None = None, limits: torch.Tensor | None = None, records=None) -> Rollout:
        static = self.captured_decode and next(policy.parameters()).is_cuda
        return generate(self.sampler(policy), tokenizer, texts, temperatures, top_p, max_new_tokens,
                        generator=generator, all_done=all_done, options=options, limits=limits, static=static)
