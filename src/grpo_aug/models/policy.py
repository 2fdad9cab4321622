"""The networks of a run: the policy that trains and the reference it is held to.

The reference is a frozen copy of the starting policy; with LoRA it is the policy itself with its
adapter switched off; with beta 0 for the whole run there is none. It is kept out of the
LightningModule's registered modules: not trained, not in the optimizer, not in checkpoints (it is
rebuilt from name_or_path on resume). With an adapter, checkpoints hold the adapter alone.
"""

from __future__ import annotations

import contextlib

import torch

from grpo_aug.errors import UsageError
from grpo_aug.fast_llama.decode import LEAN_FLAG
from grpo_aug.models.loading import frozen_copy, load_policy
from grpo_aug.models.lora import Lora, NoLora, adapter_off, trainable_keys
from grpo_aug.models.sharding import shard_like_policy


class PolicyModels:
    def __init__(self, name_or_path: str, dtype: str = "float32", lora: Lora | NoLora | None = None,
                 gradient_checkpointing: bool = False, lean: bool = True, keep_reference: bool = True,
                 reference_dtype: str | None = None) -> None:
        self.name_or_path, self.dtype, self.reference_dtype = name_or_path, dtype, reference_dtype
        self.lora = lora or NoLora()
        self.gradient_checkpointing, self.lean, self.keep_reference = gradient_checkpointing, lean, keep_reference
        self.policy: torch.nn.Module | None = None
        self.frozen: list[torch.nn.Module] = []

    def load(self) -> torch.nn.Module:
        policy = load_policy(self.name_or_path, self.dtype)
        policy.train()  # from_pretrained returns eval mode; training wants dropout as configured
        setattr(policy, LEAN_FLAG, self.lean)
        if self.gradient_checkpointing:  # HF checkpoints in training mode only: sampling (eval mode) keeps its cache
            policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.keep_reference and not self.lora.active:  # no copy with beta 0 all run, or with an adapter
            self.frozen = [frozen_copy(policy, self.reference_dtype)]
        self.policy = self.lora.apply(policy)
        return self.policy

    def reference(self):
        """A context giving the reference model: the frozen copy, or the policy with its adapter off."""
        return adapter_off(self.policy) if self.lora.active else contextlib.nullcontext(self.frozen[0])

    def place(self, device: torch.device, strategy) -> None:
        """The reference on the policy's device, sharded like the policy where the strategy shards."""
        self.frozen = [shard_like_policy(model.to(device), strategy, device) for model in self.frozen]

    def saved(self, state_dict: dict) -> dict:
        """What a checkpoint keeps of the module's state: everything, or with an adapter the adapter."""
        if not self.lora.active:
            return state_dict
        keep = trainable_keys(self.policy, "policy.")
        return {k: v for k, v in state_dict.items() if k in keep or not k.startswith("policy.")}

    def check_loadable(self, state_dict: dict) -> None:
        if self.lora.active:
            missing = trainable_keys(self.policy, "policy.") - set(state_dict)
            if missing:
                raise UsageError(f"the checkpoint lacks {len(missing)} adapter weights (e.g. {sorted(missing)[0]}): "
                                 "it was not saved with this model.lora configuration")
