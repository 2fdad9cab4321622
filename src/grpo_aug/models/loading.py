"""Load a causal LM and its tokenizer by hub id or local path, with errors that name the path."""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from grpo_aug.dtypes import DTYPES
from grpo_aug.errors import UsageError
from grpo_aug.resume import read_checkpoint


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as err:
        raise UsageError(f"model.name_or_path={name_or_path!r}: cannot load a tokenizer ({err})") from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.eos_token_id is None:
        raise UsageError(f"model.name_or_path={name_or_path!r}: the tokenizer has no EOS token")
    return tokenizer


def load_policy(name_or_path: str, dtype: str = "float32") -> PreTrainedModel:
    if dtype not in DTYPES:
        raise UsageError(f"model.dtype={dtype!r} is not one of {sorted(DTYPES)}")
    try:
        return AutoModelForCausalLM.from_pretrained(name_or_path, dtype=DTYPES[dtype])
    except (OSError, ValueError) as err:
        raise UsageError(f"model.name_or_path={name_or_path!r}: cannot load a causal LM ({err})") from err


def frozen_copy(model: torch.nn.Module, dtype: str | None = None) -> torch.nn.Module:
    """The reference model: an eval-mode copy of the initial policy that never gets gradients;
    dtype: its weights cast (e.g. bfloat16: it only runs forwards), buffers (RoPE) as they were."""
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    if dtype is not None:
        if dtype not in DTYPES:
            raise UsageError(f"model.reference_dtype must be null or one of {sorted(DTYPES)}, got {dtype!r}")
        for p in ref.parameters():
            p.data = p.data.to(DTYPES[dtype])
    return ref


def save_pretrained_dir(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out: Path,
                        state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Write model + tokenizer to a temporary sibling, then rename: a run killed mid-write never
    leaves a half-written directory that a later run would take for a finished one.
    state_dict: the whole model's weights when the model itself holds only a shard (FSDP2)."""
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    model.save_pretrained(tmp, state_dict=state_dict)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(out)
    except OSError:
        if not (out / "config.json").is_file():
            raise
        shutil.rmtree(tmp)  # another rank finished the same directory first
    return out


def checkpoint_policy(path: str) -> tuple[str, dict[str, torch.Tensor]]:
    """A training checkpoint as a model: the path its run loaded the policy from, and the policy's
    weights. The base path must still exist (it holds the architecture and the tokenizer)."""
    ckpt = read_checkpoint(path, "model.name_or_path")
    base = (ckpt.get("hyper_parameters") or {}).get("name_or_path")
    weights = {k[len("policy."):]: v for k, v in ckpt.get("state_dict", {}).items() if k.startswith("policy.")}
    if base is None or not weights:
        raise UsageError(f"model.name_or_path={path!r}: not a grpo-aug training checkpoint (no policy weights)")
    return base, weights
