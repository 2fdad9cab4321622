"""Prompt records and the task sources that make them: synthetic arithmetic, GSM8K, any JSONL or
Parquet dataset, prompt variants; how a record is rendered for the model (prompt_format)."""

from grpo_aug.data.records import Prompt

__all__ = ["Prompt"]
