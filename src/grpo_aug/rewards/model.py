"""A reward model as a reward function (`reward=model`, or an entry of `reward.functions`).

An `AutoModelForSequenceClassification` (a local path or hub id) scores each prompt + completion:
its first logit, then `(logit - shift) / scale`, squashed by a sigmoid if asked (so that it can sit
next to 0/1 rewards with a known weight). As in TRL, a conversational prompt (one the run renders
through the chat template) goes through the reward model's own chat template (the messages the
policy saw, then the completion as the assistant's); a text prompt is followed by the completion.
Batched, without gradients, in rows of `batch_size`, on the trainer's device (the current CUDA
device, else the CPU).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from grpo_aug.data.records import Prompt
from grpo_aug.dtypes import DTYPES
from grpo_aug.errors import UsageError
from grpo_aug.rewards.trl import conversations_of


class ModelReward:
    batched = True  # one call per step: the forwards batch rows

    def __init__(self, name_or_path: str, batch_size: int = 16, shift: float = 0.0, scale: float = 1.0,
                 sigmoid: bool = False, max_length: int | None = None, dtype: str = "float32",
                 name: str = "reward_model") -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        checks = [(batch_size >= 1, f"reward model batch_size must be >= 1, got {batch_size}"),
                  (math.isfinite(scale) and scale > 0, f"reward model scale must be > 0, got {scale}"),
                  (math.isfinite(shift), f"reward model shift must be finite, got {shift}"),
                  (max_length is None or max_length >= 1, f"reward model max_length must be >= 1, got {max_length}"),
                  (dtype in DTYPES, f"reward model dtype must be one of {sorted(DTYPES)}, got {dtype!r}")]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(name_or_path)
            self.model = AutoModelForSequenceClassification.from_pretrained(name_or_path, dtype=DTYPES[dtype])
        except (OSError, ValueError) as err:
            raise UsageError(f"reward model {name_or_path!r}: cannot load a sequence classifier ({err})") from err
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # the classifier reads the last token that is not padding: it must know which id pads
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.eval().requires_grad_(False)
        self.name, self.name_or_path = name, name_or_path
        self.batch_size, self.shift, self.scale, self.sigmoid = batch_size, shift, scale, sigmoid
        self.max_length = max_length

    def texts(self, prompts: Sequence[Prompt], completions: Sequence[str],
              conversations: Sequence[list[dict] | None] | None = None) -> list[str]:
        out = []
        for p, c, chat in zip(prompts, completions, conversations_of(prompts, conversations), strict=True):
            if chat is None:
                out.append(p.prompt + c)
                continue
            if not getattr(self.tokenizer, "chat_template", None):
                raise UsageError(f"reward model {self.name_or_path!r} has no chat template, and prompt {p.id!r} is a "
                                 "conversation: use a reward model with one")
            out.append(self.tokenizer.apply_chat_template([*chat, {"role": "assistant", "content": c}],
                                                          tokenize=False))
        return out

    @torch.no_grad()
    def __call__(self, prompts: Sequence[Prompt], texts: Sequence[str], completion_ids=None, state=None,
                 conversations: Sequence[list[dict] | None] | None = None) -> list[float]:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        self.model.to(device)
        inputs, scores = self.texts(prompts, texts, conversations), []
        for i in range(0, len(inputs), self.batch_size):
            enc = self.tokenizer(inputs[i : i + self.batch_size], return_tensors="pt", padding=True,
                                 padding_side="right", add_special_tokens=False,
                                 truncation=self.max_length is not None, max_length=self.max_length).to(device)
            logits = self.model(**enc).logits[:, 0].float()  # [b] the first label's logit
            scores.append((logits - self.shift) / self.scale)
        out = torch.cat(scores)  # [N]
        return (out.sigmoid() if self.sigmoid else out).tolist()
