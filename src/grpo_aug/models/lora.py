"""LoRA adapters through PEFT (`model/lora=none|on`).

With an adapter the policy trains only the low-rank matrices, and the reference model is the same
network with the adapter switched off: no second copy of the weights is held. Checkpoints then
hold the adapter and its optimizer state only (the base weights are reloaded from the model path,
as the reference always was), and the final `policy/` is the adapter, plus the merged full model
in `policy/merged/` with `model.lora.merge_on_save=true`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from grpo_aug.errors import MissingPackage, UsageError

LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class NoLora:
    active = False
    merge_on_save = False

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        return model


class Lora:
    active = True

    def __init__(self, r: int = 16, alpha: float = 32, dropout: float = 0.0,
                 target_modules: Sequence[str] = LLAMA_LINEARS, merge_on_save: bool = False) -> None:
        checks = [
            (r >= 1, f"model.lora.r must be >= 1, got {r}"),
            (alpha > 0, f"model.lora.alpha must be > 0, got {alpha}"),
            (0 <= dropout < 1, f"model.lora.dropout must be in [0, 1), got {dropout}"),
            (len(target_modules) > 0, "model.lora.target_modules must name at least one module"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        self.r, self.alpha, self.dropout = int(r), float(alpha), float(dropout)
        self.target_modules, self.merge_on_save = list(target_modules), bool(merge_on_save)

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError as err:
            raise MissingPackage("model/lora=on needs PEFT: pip install -e '.[lora]'") from err
        present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        missing = [m for m in self.target_modules if m not in present]
        if missing:
            raise UsageError(f"model.lora.target_modules: {missing} are not modules of this model "
                             f"({type(model).__name__})")
        config = LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
                            target_modules=self.target_modules, task_type="CAUSAL_LM")
        return get_peft_model(model, config)


@contextlib.contextmanager
def adapter_off(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The base model: the policy with its adapter switched off for the duration."""
    with model.disable_adapter():
        yield model


def trainable_keys(model: torch.nn.Module, prefix: str = "") -> set[str]:
    return {prefix + name for name, p in model.named_parameters() if p.requires_grad}


def save_merged(model: torch.nn.Module, out: Path) -> Path:
    """The full model with the adapter folded into the weights, from a copy (the run's model keeps its adapter)."""
    merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(out)
    return out
