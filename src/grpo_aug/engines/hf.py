"""`rollout/engine=hf`: the policy samples itself (engines/sampling.py: batched, KV-cached, per-row
temperatures, the lean decode loop where the model allows). Nothing to load or to sync."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from grpo_aug.engines.knobs import Knobs
from grpo_aug.engines.sampling import generate
from grpo_aug.engines.types import Rollout


class HFEngine:
    """captured_decode: on CUDA, the Llama-family decode step as one captured CUDA graph per
    rollout (lean/static_decode.py: the same tokens as the eager step); ignored elsewhere."""

    name = "hf"
    external = False  # its log-probs come from the policy's own forward: nothing to correct

    def __init__(self, captured_decode: bool = False) -> None:
        self.captured_decode = captured_decode

    def setup(self, name_or_path: str, tokenizer, seed: int) -> None:
        pass

    def sync(self, policy: torch.nn.Module, step: int) -> None:
        pass  # the policy is the engine

    def generate(self, policy: torch.nn.Module, tokenizer, texts: Sequence[str] | Sequence[Sequence[int]],
                 temperatures: torch.Tensor, top_p: float, max_new_tokens: int,
                 generator: torch.Generator | None = None, all_done: Callable[[bool], bool] | None = None,
                 knobs: Knobs | None = None, limits: torch.Tensor | None = None, records=None) -> Rollout:
        static = self.captured_decode and next(policy.parameters()).is_cuda
        return generate(policy, tokenizer, texts, temperatures, top_p, max_new_tokens, generator=generator,
                        all_done=all_done, knobs=knobs, limits=limits, static=static)
