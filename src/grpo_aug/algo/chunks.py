"""Length-sorted chunks: score rows of similar completion length together when that pays.

Every row of a padded block costs as much as the longest one. Sorting rows by completion length
and splitting them into chunks, each padded to its own longest row, saves that padding, at the
price of one more forward (and backward) per chunk. Used by the module (which rows are scored
together) and by the packed forward (which completions attend together).
"""

from __future__ import annotations

import torch

# Share of the scored block that length-sorted chunks must save before rows are split into them:
# below it, the extra forward calls cost more than the padding they avoid.
CHUNK_WHEN_SAVING_ABOVE = 0.3


def chunk_saving(lengths: torch.Tensor, prompt_len: int, chunks: int) -> float:
    """Share of the scored block (prompt + completion columns, every row padded to the longest)
    that length-sorted chunks, each padded to its own longest row, would not compute."""
    if len(lengths) == 0 or chunks <= 1:
        return 0.0
    whole = len(lengths) * (prompt_len + int(lengths.max()))
    split = sum(len(c) * (prompt_len + int(lengths[c].max())) for c in length_chunks(lengths, chunks) if len(c))
    return 1.0 - split / whole


def length_chunks(lengths: torch.Tensor, chunks: int) -> list[torch.Tensor]:
    """Row indices in `chunks` groups of similar completion length, shortest first (some may be
    empty when there are fewer rows than chunks)."""
    if chunks <= 1:
        return [torch.arange(len(lengths), device=lengths.device)]
    return list(torch.tensor_split(torch.argsort(lengths, stable=True), chunks))
