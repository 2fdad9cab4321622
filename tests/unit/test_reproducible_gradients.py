"""Seeded runs repeat bit for bit on a multi-threaded CPU: the scoring forwards' gradients do not
depend on the order in which threads finish.

A group's rows share their prompt, so the forwards copy each prompt's keys, values and last
logits out to its rows. Written as `t[index]`, the backward of that copy adds the rows' gradients
with parallel atomic float adds on a CPU with 2+ threads, in an order that varies from run to run
(issue 49: two runs of one command parted in the 7th digit within a few steps, and later in their
accuracies). The forwards use index_select, whose backward sums in a fixed order."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import grpo_aug.fast_llama.logprobs as lean_logprobs
from grpo_aug.fast_llama.logprobs import token_logprobs


def _gradients(model, ids, mask, P, temps) -> list[torch.Tensor]:
    model.zero_grad()
    logps = token_logprobs(model, ids, mask, P, temps)  # [N, T]
    (logps * mask[:, P:]).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_scoring_gradients_repeat_bit_for_bit_with_two_threads(monkeypatch):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        P, T, prompts, G = 24, 16, 16, 8
        # rows of a prompt interleaved (as length-sorted groups leave them), so that both threads
        # add into every prompt's gradient; the copied keys hold well over ATen's grain size
        # (32768 elements), the parallel path's threshold
        rows = torch.arange(prompts).repeat(G)  # [N]
        ids = torch.cat([torch.randint(4, 60, (prompts, P))[rows], torch.randint(4, 60, (len(rows), T))], 1)
        mask = torch.ones_like(ids)
        mask[torch.arange(len(rows)), P + torch.randint(2, T, (len(rows),))] = 0
        mask[:, P:] = mask[:, P:].cummin(dim=1).values  # completions end where their mask first drops
        temps = torch.tensor([0.7, 1.0, 1.2, 1.5]).repeat(len(rows) // 4)
        for packed in (True, False):
            # False: the HF forward with the prompts' shared-prefix cache (sharded weights take it)
            monkeypatch.setattr(lean_logprobs, "packable", lambda model, packed=packed: packed)
            config = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=4)
            model = LlamaForCausalLM(config)
            first = _gradients(model, ids, mask, P, temps)
            for _ in range(8):
                again = _gradients(model, ids, mask, P, temps)
                assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True)), f"packed={packed}"
    finally:
        torch.set_num_threads(threads)

