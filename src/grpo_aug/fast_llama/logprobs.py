"""Token log-probabilities of completions under a model, at each row's sampling temperature.

The rows of a group share their prompt. Llama-family models take the packed forward
(`grpo_aug/fast_llama/forward.py`: each distinct prompt once, no padding tokens). Where a strategy shards the
weights, the HF forward still runs each prompt once and indexes its keys/values out to the rows
(gradients flow back through the index and add up), then only the completion tokens run,
attending to that shared prefix. Both give the numbers of one forward over every full row.
Under sharded weights each forward is a collective, so the number of forwards must not follow
the data: the two-forward path is taken whatever the rows (update/lockstep.py, rule 5).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from grpo_aug.fast_llama.compat import activation_checkpointing, cache_kwargs, keep_last
from grpo_aug.fast_llama.decode import sharded, supports
from grpo_aug.fast_llama.forward import packable, packed_completion_logits, packed_completion_logprobs
from grpo_aug.fast_llama.vocab_logprobs import BLOCK_ELEMENTS

ENTROPY_BLOCK = 16  # rows per softmax when measuring entropy


def _completion_logits(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       prompt_len: int, length_groups: int) -> torch.Tensor:
    """Logits [N, T, V] predicting each completion token, with shared prompts run once."""
    if packable(model) and prompt_len > 0:
        return packed_completion_logits(model, input_ids, attention_mask, prompt_len, length_groups)
    # the shared-prefix cache needs use_cache, which checkpointed layers switch off while training
    checkpointed = activation_checkpointing(model) and model.training
    T = input_ids.shape[1] - prompt_len
    if sharded(model) and supports(model) and not checkpointed and (prompt_len < 2 or T < 2):
        # two forwards whatever the rows: widen to two prompt and two completion columns, masked out
        left, right = max(0, 2 - prompt_len), max(0, 2 - T)
        input_ids = torch.nn.functional.pad(input_ids, (left, right))  # [N, P' + T']
        attention_mask = torch.nn.functional.pad(attention_mask, (left, right))  # [N, P' + T']
        return _completion_logits(model, input_ids, attention_mask, prompt_len + left, length_groups)[:, :T]
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [N, P+T]
    prompts, row_prompt = torch.unique(input_ids[:, :prompt_len], dim=0, return_inverse=True)  # [U, P], [N]
    one_forward = prompt_len < 2 or T < 2 or len(prompts) == len(input_ids)
    if (one_forward and not sharded(model)) or not supports(model) or checkpointed:
        # only the positions that predict completion tokens go through the vocabulary projection
        keep = input_ids.shape[1] - prompt_len + 1
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       logits_to_keep=keep_last(model, keep, input_ids.shape[1])).logits  # [N, T+1, V]
        return logits[:, :-1]  # [N, T, V]
    first = torch.zeros(len(prompts), dtype=torch.long, device=input_ids.device)
    first[row_prompt] = torch.arange(len(input_ids), device=input_ids.device)  # a row holding each prompt
    cache = DynamicCache()
    head = model(input_ids=prompts, attention_mask=attention_mask[first, :prompt_len],
                 position_ids=position_ids[first, :prompt_len], use_cache=True,
                 logits_to_keep=keep_last(model, 1, prompt_len),
                 **cache_kwargs(model, cache))
    for layer in cache.layers:  # [U, KV, P, D] -> [N, KV, P, D], differentiable
        # index_select: its backward sums a prompt's rows in a fixed order (fast_llama/forward.py, _layer)
        layer.keys, layer.values = layer.keys.index_select(0, row_prompt), layer.values.index_select(0, row_prompt)
    tail = model(input_ids=input_ids[:, prompt_len:-1], attention_mask=attention_mask[:, :-1],
                 position_ids=position_ids[:, prompt_len:-1], use_cache=True,
                 **cache_kwargs(model, cache)).logits  # [N, T-1, V]
    return torch.cat([head.logits[:, -1:].index_select(0, row_prompt), tail], dim=1)  # [N, T, V]


def blocked_vocabulary(model: torch.nn.Module, input_ids: torch.Tensor, prompt_len: int) -> bool:
    """Score through fast_llama/vocab_logprobs.py: the packed forward applies, and the rows' logits would
    not fit one of its blocks (a real vocabulary). Smaller ones (the default tiny model's 19
    tokens) keep the direct path, whose numbers the default run was measured with."""
    if not (packable(model) and prompt_len > 0) or getattr(model.lm_head, "bias", None) is not None:
        return False
    vocab = model.lm_head.weight.shape[0]
    return input_ids.shape[0] * (input_ids.shape[1] - prompt_len) * vocab > BLOCK_ELEMENTS


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: int,
    temperatures: torch.Tensor,
    with_entropy: bool = False,
    length_groups: int = 1,
    entropy_grad: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log p(completion token | prefix) for every completion position.

    input_ids/attention_mask: [N, P + T] (prompts left-padded to P); temperatures: [N].
    Logits are divided by the row's temperature so the ratio compares the same distribution
    that sampled the row (a greedy row, T = 0, is scored at T = 1). Returns [N, T] float32, and
    with `with_entropy` also the entropy of each position's distribution, [N, T].
    length_groups: for packed models, completions attend in up to this many length-sorted groups.
    entropy_grad: the entropy keeps its graph (an entropy bonus in the loss differentiates it).
    """
    temps = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures))
    if blocked_vocabulary(model, input_ids, prompt_len):
        logps, entropy = packed_completion_logprobs(model, input_ids, attention_mask, prompt_len, temps,
                                                    length_groups, with_entropy)
        if not with_entropy:
            return logps
        return logps, (entropy if entropy_grad else entropy.detach())
    # [N, T, V]: the logits that predict tokens P..P+T-1
    logits = _completion_logits(model, input_ids, attention_mask, prompt_len, length_groups).float()
    logits = logits / temps.to(logits.dtype)[:, None, None]  # [N, T, V]
    targets = input_ids[:, prompt_len:]  # [N, T]
    # gather - logsumexp avoids materialising a second [N, T, V] log_softmax tensor
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [N, T]
    lse = torch.logsumexp(logits, dim=-1)  # [N, T]
    logps = picked - lse
    if not with_entropy:
        return logps
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        # H = logsumexp(z) - sum softmax(z) z, in blocks of rows to bound the [rows, T, V] temporaries
        blocks = []
        for i in range(0, len(logits), ENTROPY_BLOCK):
            z = logits[i : i + ENTROPY_BLOCK]  # [rows, T, V]
            blocks.append(lse[i : i + ENTROPY_BLOCK] - (torch.softmax(z, -1) * z).sum(-1))
        entropy = torch.cat(blocks)  # [N, T]
    return logps, entropy  # [N, T], [N, T]
