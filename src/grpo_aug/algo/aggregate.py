"""Loss aggregation variants (`algo/loss=...`): how per-token terms become one scalar.

per_token and mask are [R, T] (R rows). The choice changes which completions weigh most:
    row_mean       mean over each row's tokens, then over rows: every completion counts
                   equally, so tokens of long completions count less (GRPO paper)
    token_mean     sum over all tokens / number of tokens: every token counts equally (DAPO)
    constant_norm  sum over all tokens / (R x constant): no length bias either way (Dr. GRPO)
    row_sum        sum over each row's tokens, then mean over rows: with GSPO's sequence ratio,
                   each row's loss scaled by its length (LUSPO)
A row whose mask is all zero contributes 0 to every variant.

`part(per_token, mask, rows, tokens)` is the contribution of a slice of the rows to the loss of
the whole update (`rows` and `tokens` counted over the whole update): the parts of a split sum
to the unsplit loss, so length-sorted chunks can each run their own backward.
"""

from __future__ import annotations

import torch

from grpo_aug.errors import UsageError


class Aggregate:
    def __call__(self, per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.part(per_token, mask, per_token.shape[0], mask.sum())


class RowMean(Aggregate):
    name = "row_mean"

    def part(self, per_token: torch.Tensor, mask: torch.Tensor, rows: int, tokens: torch.Tensor) -> torch.Tensor:
        per_row = (per_token * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)  # [R]
        return per_row.sum() / max(rows, 1)


class TokenMean(Aggregate):
    name = "token_mean"

    def part(self, per_token: torch.Tensor, mask: torch.Tensor, rows: int, tokens: torch.Tensor) -> torch.Tensor:
        return (per_token * mask).sum() / tokens.clamp(min=1.0)


class ConstantNorm(Aggregate):
    name = "constant_norm"

    def __init__(self, constant: float) -> None:
        if constant <= 0:
            raise UsageError(f"algo.loss.constant must be > 0, got {constant}")
        self.constant = float(constant)

    def part(self, per_token: torch.Tensor, mask: torch.Tensor, rows: int, tokens: torch.Tensor) -> torch.Tensor:
        return (per_token * mask).sum() / (max(rows, 1) * self.constant)


class RowSum(Aggregate):
    name = "row_sum"

    def part(self, per_token: torch.Tensor, mask: torch.Tensor, rows: int, tokens: torch.Tensor) -> torch.Tensor:
        return (per_token * mask).sum() / max(rows, 1)
