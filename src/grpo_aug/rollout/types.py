"""What a rollout hands to the loss: token ids, masks and per-row temperatures."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Rollout(NamedTuple):
    input_ids: torch.Tensor  # [N, P + T] prompt (left-padded to P) then completion (right-padded)
    attention_mask: torch.Tensor  # [N, P + T] 1 on real prompt and completion tokens
    completion_mask: torch.Tensor  # [N, T] 1 on generated tokens up to and including EOS
    temperatures: torch.Tensor  # [N] the temperature each row was sampled at
    prompt_len: int  # P
    texts: list[str]  # N decoded completions (special tokens removed)
    truncated: torch.Tensor  # [N] bool, no EOS within max_new_tokens
    # [N, T] the sampler's log-prob of each sampled token (at the row's temperature, before top-p);
    # None when the engine reports none. The trainer's own log-probs should match it (rollout/logprob_gap)
    sample_logprobs: torch.Tensor | None = None
    # [N, T] bool completion tokens the rollout wrote, not the policy (a reference prefix,
    # rollout/guide.py): later tokens are scored after them, they carry no loss. None: none
    given: torch.Tensor | None = None
    # multi-turn rollouts (rollout/turns.py); None without tools
    tool_calls: torch.Tensor | None = None  # [N] tool calls the row made
    tool_failures: torch.Tensor | None = None  # [N] of them, calls that raised, timed out or were refused
    segments: list[list[tuple[str, str]]] | None = None  # per row, (role, text): policy | tool | environment
    env_rewards: torch.Tensor | None = None  # [N] an environment's reward per row (NaN: none); None: no environment

    @property
    def written(self) -> torch.Tensor:
        """[N, T] the completion tokens the policy wrote (the completion without `given`)."""
        return self.completion_mask if self.given is None else self.completion_mask.masked_fill(self.given, 0)
