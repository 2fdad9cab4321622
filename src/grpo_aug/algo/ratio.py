"""Importance-ratio levels (`algo/ratio=token|sequence`): the log-ratio the PPO clip acts on.

    token     log pi(y_t) - log pi_old(y_t) per token (PPO, GRPO, DAPO)
    sequence  GSPO: the masked mean of a row's token log-ratios, one ratio per completion,
              broadcast to its tokens, so the clip keeps or drops whole rows. Its values sit
              near 1 (a length-normalised ratio), so GSPO clips at ~3e-4 / 4e-4, not 0.2.
Both take and return log-ratios, [..., T] in and [..., T] (token) or [..., 1] (sequence) out.
"""

from __future__ import annotations

import torch


class TokenRatio:
    def __call__(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return log_ratio  # [..., T]


class SequenceRatio:
    def __call__(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)  # [..., 1]
