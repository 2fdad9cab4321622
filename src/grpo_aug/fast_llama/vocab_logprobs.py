"""Token log-probs (and entropies) from hidden states, block by block: no [tokens, V] tensor lives.

Scoring a completion token needs the whole vocabulary's logits at its position, but only two
numbers survive: the target's logit and the log-normaliser. With a real vocabulary the logits
are most of a step's memory and much of its time (SmolLM2, 64 rows x ~33 tokens x 49,152 entries:
0.8 GB per float32 copy; the cast, the temperature division, logsumexp and their backward each
wrote or read one, and on this CPU fresh pages cost more than the arithmetic: a reference forward
spent 3 of its 4.8 s there). Here the vocabulary projection runs on blocks of tokens small
enough to stay in reused memory; backward recomputes each block's logits (one more vocabulary
matmul) from the saved hidden states instead of keeping them.

The numbers are those of `linear -> float32 -> / T -> log_softmax -> gather` in the same
precision: under autocast the projection runs in the autocast dtype, as the module would, and
the gradient reaches the float32 weight (tied embeddings included) through autograd as usual.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grpo_aug.fast_llama.decode import _Product, prepacks

BLOCK_ELEMENTS = 1 << 22  # float32 logits per block: 16 MB, below glibc's mmap threshold (host_memory.py)
GRAD_BYTES = 256 << 20  # backward: the logits' gradients of this many bytes go through one weight-sized matmul


def block_rows(vocab: int) -> int:
    return max(1, BLOCK_ELEMENTS // vocab)


def _compute_dtype(h: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype a linear layer computes in here: autocast's, when it is on for this device."""
    if torch.is_autocast_enabled(h.device.type):
        return torch.get_autocast_dtype(h.device.type)
    return torch.promote_types(h.dtype, weight.dtype)


def _projection(w: torch.Tensor):
    """h [b, H] -> logits [b, V] through w [V, H]: in float32 the decode's oneDNN-packed product where
    it packs one (fast_llama/decode.prepacks; on an AVX2 CPU, blocks of 85 of SmolLM2's tokens at 124
    against MKL's 78 GFLOP/s, for one 60 ms reorder per pass). bf16 keeps F.linear: packing the
    vocabulary was measured in float32 only."""
    if w.dtype == torch.float32 and prepacks(w):
        return _Product(w, None)
    return lambda h: F.linear(h, w)


def _tempered(h: torch.Tensor, project, temps: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """h [b, H], project from _projection in dtype, temps [b] -> float32 logits / T [b, V]."""
    return project(h.to(dtype)).float() / temps[:, None]


class _VocabLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, temps, with_entropy: bool, dtype: torch.dtype):
        step = block_rows(weight.shape[0])
        project = _projection(weight.to(dtype))  # [V, H] once: a cast per block would copy the projection each time
        logps = torch.empty(len(h), dtype=torch.float32, device=h.device)  # [M]
        lse = torch.empty_like(logps)  # [M]
        entropy = torch.empty_like(logps) if with_entropy else logps.new_empty(0)  # [M]
        for i in range(0, len(h), step):
            rows = slice(i, i + step)
            z = _tempered(h[rows], project, temps[rows], dtype)  # [b, V]
            lse[rows] = torch.logsumexp(z, dim=-1)
            logps[rows] = z.gather(-1, targets[rows, None]).squeeze(-1) - lse[rows]
            if with_entropy:  # H = logsumexp(z) - sum softmax(z) z
                entropy[rows] = lse[rows] - torch.softmax(z, dim=-1).mul_(z).sum(-1)
        ctx.save_for_backward(h, weight, targets, temps, lse, entropy)
        ctx.dtype = dtype
        ctx.set_materialize_grads(False)  # an output nothing differentiates gets None, not zeros
        return logps, entropy

    @staticmethod
    def backward(ctx, grad_logps, grad_entropy):
        h, weight, targets, temps, lse, entropy = ctx.saved_tensors
        dtype, step = ctx.dtype, block_rows(weight.shape[0])
        if grad_logps is None:
            grad_logps = torch.zeros_like(lse)
        entropy_used = grad_entropy is not None and entropy.numel() > 0
        w = weight.to(dtype)  # [V, H]
        project = _projection(w)
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_w = None
        # the logits' gradients, block by block into a buffer of a few hundred MB whose rows then
        # meet the weight in one matmul each way (per block, K = b rows made the weight's gradient
        # a chain of thin matmuls and float32 accumulations of the whole [V, H])
        span = max(step, GRAD_BYTES // (weight.shape[0] * torch.finfo(dtype).bits // 8) // step * step)
        buffer = torch.empty(min(span, len(h)), weight.shape[0], dtype=dtype, device=h.device)  # [s, V]
        for start in range(0, len(h), span):
            stop = min(start + span, len(h))
            grads = buffer[: stop - start]  # [s, V]
            for i in range(start, stop, step):
                rows = slice(i, min(i + step, stop))
                z = _tempered(h[rows], project, temps[rows], dtype)  # [b, V] recomputed, not kept
                log_p = z - lse[rows, None]  # [b, V]
                p = log_p.exp()  # [b, V]
                # d logp_target / dz = onehot(target) - p;  dH / dz = -p (log p + H)
                grad_z = p * -grad_logps[rows, None]  # [b, V]
                if entropy_used:
                    grad_z -= p * (log_p + entropy[rows, None]) * grad_entropy[rows, None]
                grad_z.scatter_add_(-1, targets[rows, None], grad_logps[rows, None])
                grads[i - start : rows.stop - start] = grad_z / temps[rows, None]  # through z = logits / T
            if grad_h is not None:
                grad_h[start:stop] = (grads @ w).to(h.dtype)  # [s, H]
            if ctx.needs_input_grad[1]:
                part = grads.t() @ h[start:stop].to(dtype)  # [V, H]
                grad_w = part.float() if grad_w is None else grad_w.add_(part)
        grad_w = None if grad_w is None else grad_w.to(weight.dtype)
        return grad_h, grad_w, None, None, None, None


def vocab_logprobs(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temps: torch.Tensor,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """h [M, H] final hidden states, weight [V, H] the vocabulary projection (no bias), targets [M],
    temps [M] > 0 -> log softmax(h W^T / T)[target] [M] float32, and the entropy [M] with
    with_entropy (its gradient is exact; whether it is taken is the caller's grad mode)."""
    dtype = _compute_dtype(h, weight)
    with torch.autocast(h.device.type, enabled=False):
        logps, entropy = _VocabLogprobs.apply(h, weight, targets, temps.float(), with_entropy, dtype)
    return logps, (entropy if with_entropy else None)
