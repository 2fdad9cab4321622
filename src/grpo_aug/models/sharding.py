"""Sharded weights (`trainer=fsdp|deepspeed`): which layers FSDP wraps, and a reference model
sharded like the policy.

Lightning wraps the LightningModule, so the policy is sharded by the strategy; the frozen
reference lives outside the module tree (not trained, not checkpointed) and is wrapped here with
the strategy's own settings. Under ZeRO-3 DeepSpeed partitions what it is given; the reference
is best avoided there: LoRA (model/lora=on, the reference is the adapter-off policy) or beta 0
(no reference) hold no second copy at all.
"""

from __future__ import annotations

import importlib

import torch

# decoder layer classes of the families grpo-aug is tested with; each FSDP unit is one layer
DECODER_LAYERS = {
    "transformers.models.llama.modeling_llama": "LlamaDecoderLayer",
    "transformers.models.qwen2.modeling_qwen2": "Qwen2DecoderLayer",
    "transformers.models.qwen3.modeling_qwen3": "Qwen3DecoderLayer",
    "transformers.models.mistral.modeling_mistral": "MistralDecoderLayer",
}


def decoder_layer_classes() -> set[type[torch.nn.Module]]:
    """The decoder layer classes this transformers version has: FSDP's auto-wrap policy."""
    found = set()
    for module, name in DECODER_LAYERS.items():
        try:
            found.add(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return found


def shard_like_policy(reference: torch.nn.Module, strategy, device: torch.device) -> torch.nn.Module:
    """The reference wrapped in FSDP with the strategy's sharding settings; as it is otherwise."""
    from lightning.pytorch.strategies import FSDPStrategy

    if not isinstance(strategy, FSDPStrategy):
        return reference
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel(reference, sharding_strategy=strategy.sharding_strategy,
                                    cpu_offload=strategy.cpu_offload, device_id=device, **strategy.kwargs)
