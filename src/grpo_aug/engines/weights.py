"""The policy's weights as an engine loads them: streamed one tensor at a time, adapters folded in,
FSDP2 shards gathered on demand (the colocated engine's reload and the server's weight push)."""

from __future__ import annotations

from collections.abc import Iterator

import torch


def policy_weights(policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights an engine samples with, as (name, tensor) in the policy's state_dict order:
    the policy's own or, for a PEFT adapter, the base model's with each adapter's delta added,
    out of place (merge_adapter then unmerge_adapter would leave the policy a rounding error off).
    Names are the base model's.

    Under FSDP2 each parameter is a DTensor shard: it is gathered whole (`full_tensor()`, a
    collective) only when the consumer asks for it, so one whole tensor exists at a time on top of
    what the consumer keeps (vLLM's reload assembles a layer from its tensors: at most one decoder
    layer, given in layer order), never the whole state dict. Every rank must consume the stream
    to its end, in the same order.
    """
    if not hasattr(policy, "get_base_model"):
        for name, tensor in policy.state_dict().items():
            yield name, whole(tensor)
        return
    from peft.tuners.lora import LoraLayer

    deltas = {}
    for name, module in policy.get_base_model().named_modules():
        if isinstance(module, LoraLayer) and not module.merged:
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
            deltas[f"{name}.base_layer.weight"] = delta
    with torch.no_grad():
        for name, tensor in policy.get_base_model().state_dict().items():
            if "lora_" in name:
                continue
            value = tensor + deltas[name] if name in deltas else tensor
            yield name.replace(".base_layer", ""), value.detach()


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A weight as one plain tensor: an FSDP2 shard (DTensor) gathered from every rank."""
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        return tensor.full_tensor().detach()
    return tensor.detach()
