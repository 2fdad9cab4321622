"""How likely the current policy is to write a prompt's reference solution.

The learned selector's freshest signal. A prompt's history says how its last rollout went, but
most prompts of a large dataset are rolled out once or twice in a run, so for most candidates
there is no history. One no-grad forward over prompt + reference gives, for every candidate, the
log-probability that the policy samples the reference word for word at temperature 1. A prompt
whose reference the policy would write almost surely tends to come out all right; one whose
reference is far out of reach tends to come out all wrong; both are flat groups. The selector
learns online which values mean flat (prompts/predictors.py).

The reference is the record's `solution` (a dataset without one carries its answer there), cut at
the rollout's token budget, then EOS. Under sharded weights every rank calls this once per rollout
step, so the forwards pair up.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from grpo_aug.engines.types import rollout_from_ids
from grpo_aug.fast_llama.logprobs import token_logprobs


@torch.no_grad()
def reference_logprobs(model: torch.nn.Module, tokenizer, prompt_texts: Sequence[str], references: Sequence[str],
                       max_tokens: int) -> list[float]:
    """log p(reference tokens, then EOS | prompt) under `model` at temperature 1, one per prompt."""
    device = next(model.parameters()).device
    prompts = [tokenizer(t, add_special_tokens=False).input_ids for t in prompt_texts]
    targets = [tokenizer(r, add_special_tokens=False).input_ids[:max_tokens - 1] + [tokenizer.eos_token_id]
               for r in references]
    ones = torch.ones(len(prompts))
    ro = rollout_from_ids(prompts, targets, None, ones, [""] * len(prompts), [True] * len(prompts),
                          tokenizer.pad_token_id, device)
    was_training = model.training
    model.eval()  # no dropout: the score of the policy that samples
    try:
        logps = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.prompt_len, ro.temperatures)  # [N, T]
    finally:
        model.train(was_training)
    return (logps * ro.completion_mask).sum(dim=1).tolist()  # [N]
