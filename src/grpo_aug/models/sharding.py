"""Sharded weights (`trainer=fsdp`: FSDP2, `torch.distributed.fsdp.fully_shard`; `trainer=deepspeed`):
the strategy, which layers are sharded, and a reference sharded like the policy.

FSDP2 shards every parameter along its first dimension over the data-parallel ranks; each decoder
layer is one unit (its weights gathered for its forward, freed after), then the root holds the
embeddings, final norm and head. It runs on GPUs (NCCL) and on CPU processes (gloo), which FSDP1
refuses ("FSDP needs a non-CPU accelerator device"). The frozen reference lives outside the
module tree (not trained, not checkpointed) and is sharded here the same way.
"""

from __future__ import annotations

import importlib

import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from grpo_aug.errors import UsageError

# decoder layer classes of the families grpo-aug is tested with; each FSDP unit is one layer
DECODER_LAYERS = {
    "transformers.models.llama.modeling_llama": "LlamaDecoderLayer",
    "transformers.models.qwen2.modeling_qwen2": "Qwen2DecoderLayer",
    "transformers.models.qwen3.modeling_qwen3": "Qwen3DecoderLayer",
    "transformers.models.mistral.modeling_mistral": "MistralDecoderLayer",
}


def decoder_layer_classes() -> set[type[torch.nn.Module]]:
    """The decoder layer classes this transformers version has."""
    found = set()
    for module, name in DECODER_LAYERS.items():
        try:
            found.add(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return found


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ModelParallelStrategy with every rank in one data-parallel mesh (no tensor
    parallelism), checkpoints as one full file by default (resumable with another number of ranks),
    and the module's `configure_model` applying FSDP2 (`shard_fsdp2`)."""

    def __init__(self, save_distributed_checkpoint: bool = False, **kwargs) -> None:
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1,
                         save_distributed_checkpoint=save_distributed_checkpoint, **kwargs)

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()


def shard_fsdp2(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """fully_shard each decoder layer, then the root, over `mesh` (in place; returns the model)."""
    from torch.distributed.fsdp import fully_shard

    layers = tuple(decoder_layer_classes())
    units = [m for m in model.modules() if isinstance(m, layers)]
    if not units:
        raise UsageError(f"trainer=fsdp: {type(model).__name__} has none of the decoder layers FSDP2 shards "
                         f"({sorted(c.__name__ for c in layers)}); add its layer class to DECODER_LAYERS")
    for layer in units:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def data_parallel_mesh(strategy):
    """The mesh FSDP2 shards over, or None when the strategy does not shard that way."""
    if isinstance(strategy, ModelParallelStrategy):
        return strategy.device_mesh["data_parallel"]
    return None


def shard_like_policy(reference: torch.nn.Module, strategy, device: torch.device) -> torch.nn.Module:
    """The reference sharded with FSDP2 over the policy's mesh; as it is under other strategies."""
    mesh = data_parallel_mesh(strategy)
    return reference if mesh is None else shard_fsdp2(reference, mesh)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The whole model's weights on the CPU: gathered from every rank under FSDP2 (a collective: call
    on every rank); None when the weights are not FSDP2-sharded (the model saves itself)."""
    from torch.distributed.tensor import DTensor

    if not any(isinstance(p, DTensor) for p in model.parameters()):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
