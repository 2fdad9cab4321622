"""Token log-probs of rollout rows under a model: the reference, the rollout policy, the policy.

Rows may be scored in length-sorted chunks, each trimmed to its longest completion, when that
saves more than CHUNK_WHEN_SAVING_ABOVE of the padded block. Llama-family models scored by the
packed forward compute no padding but in attention, which they group themselves: one chunk.
The decision is taken on the mean saving over ranks (`reduce_mean`), so every rank runs the same
number of forwards and backwards.

With `algo.micro_batch_rows` set, every chunk is further split into micro-batches of at most that
many rows, each its own forward (and backward, in an update): activation memory then follows the
micro-batch, not B x G. The loss parts of a split add up to the whole update's loss, so the
accumulated gradient is the full batch's. The number of micro-batches per chunk is the largest
over ranks (`reduce_max`), so ranks still run the same number of forwards; an empty part runs the
stand-in row (`update/lockstep.py`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from grpo_aug.algo.chunks import CHUNK_WHEN_SAVING_ABOVE, chunk_saving, length_chunks
from grpo_aug.engines.rows import select_rows, trim
from grpo_aug.engines.types import Rollout
from grpo_aug.fast_llama.forward import packable
from grpo_aug.fast_llama.logprobs import token_logprobs
from grpo_aug.update.lockstep import lockstep


class Scorer:
    def __init__(self, length_chunks: int = 4, reduce_mean: Callable[[float], float] | None = None,
                 micro_batch_rows: int | None = None,
                 reduce_max: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.length_chunks = length_chunks
        self.reduce_mean = reduce_mean or (lambda x: x)
        self.micro_batch_rows = micro_batch_rows
        self.reduce_max = reduce_max or (lambda x: x)

    def chunks(self, model: torch.nn.Module, lengths: torch.Tensor, prompt_len: int) -> list[torch.Tensor]:
        """Row indices of the chunks to score separately (one chunk: every row at once)."""
        k = 1 if packable(model) else self.length_chunks
        saving = self.reduce_mean(chunk_saving(lengths, prompt_len, k)) if k > 1 else 0.0
        chunks = length_chunks(lengths, k if saving > CHUNK_WHEN_SAVING_ABOVE else 1)
        if self.micro_batch_rows is None:
            return chunks
        return micro_batches(chunks, self.micro_batch_rows, self.reduce_max)

    def logprobs(self, model: torch.nn.Module, ro: Rollout, chunks: list[torch.Tensor] | None = None,
                 with_entropy: bool = False, entropy_grad: bool = False):
        """[N, T] log-probs of the completion tokens (and [N, T] entropies with with_entropy),
        each chunk scored on its rows trimmed to their longest completion."""
        if chunks is None or len(chunks) == 1:
            return token_logprobs(model, ro.input_ids, ro.attention_mask, ro.prompt_len, ro.temperatures,
                                  with_entropy=with_entropy, length_groups=self.length_chunks,
                                  entropy_grad=entropy_grad)
        out = torch.zeros(ro.completion_mask.shape, dtype=torch.float32, device=ro.input_ids.device)  # [N, T]
        every = torch.arange(len(ro.texts), device=out.device)  # [N]
        for chunk in chunks:
            rows, weight = lockstep(every, chunk)  # an empty part: the stand-in row, its scores discarded
            part = trim(select_rows(ro, rows))
            scores = self.logprobs(model, part)  # [c, t]
            if weight:
                out[rows, : part.completion_mask.shape[1]] = scores
        return out


def micro_batches(chunks: list[torch.Tensor], rows: int,
                  reduce_max: Callable[[torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
    """Each chunk split into equal parts of at most `rows` rows; as many parts per chunk as the
    rank that needs most (a rank with fewer rows gets smaller, perhaps empty, parts)."""
    device = chunks[0].device
    needed = torch.tensor([-(-len(c) // rows) for c in chunks], device=device)  # [k] ceil(len / rows)
    parts = reduce_max(needed).tolist()  # [k]
    return [part for chunk, n in zip(chunks, parts, strict=True) for part in torch.tensor_split(chunk, max(int(n), 1))]
