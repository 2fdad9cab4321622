"""Token log-probabilities of completions under a model, at each row's sampling temperature."""

from __future__ import annotations

import torch


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: int,
    temperatures: torch.Tensor,
    with_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log p(completion token | prefix) for every completion position.

    input_ids/attention_mask: [N, P + T] (prompts left-padded to P); temperatures: [N].
    Logits are divided by the row's temperature so the ratio compares the same distribution
    that sampled the row (a greedy row, T = 0, is scored at T = 1). Returns [N, T] float32, and
    with `with_entropy` also the detached entropy of each position's distribution, [N, T].
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [N, P+T]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logits = logits[:, prompt_len - 1 : -1].float()  # [N, T, V] predicts tokens P..P+T-1
    temps = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures))
    logits = logits / temps.to(logits.dtype)[:, None, None]  # [N, T, V]
    targets = input_ids[:, prompt_len:]  # [N, T]
    # gather - logsumexp avoids materialising a second [N, T, V] log_softmax tensor
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [N, T]
    lse = torch.logsumexp(logits, dim=-1)  # [N, T]
    logps = picked - lse
    if not with_entropy:
        return logps
    with torch.no_grad():
        # H = logsumexp(z) - sum softmax(z) z, one row at a time to bound the [T, V] temporaries
        entropy = torch.stack([lse[i] - (torch.softmax(logits[i], -1) * logits[i]).sum(-1) for i in range(len(logits))])
    return logps, entropy  # [N, T], [N, T]
