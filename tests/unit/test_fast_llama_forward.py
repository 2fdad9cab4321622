"""The packed scoring forward against the HF forward over full rows: logits and gradients."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import grpo_aug.fast_llama.forward as lean_forward
from grpo_aug.fast_llama.forward import packable, packed_completion_logits


def _model(kind: str, hidden: int = 32):
    torch.manual_seed(0)
    common = dict(vocab_size=30, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
    if kind == "qwen2":  # q/k/v biases, grouped KV heads
        return Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
    return LlamaForCausalLM(LlamaConfig(**common))


def _batch():
    """3 prompts (one left-padded) in 6 rows, groups not contiguous; completions of unequal length."""
    g = torch.Generator().manual_seed(1)
    P, T = 5, 6
    prompts = torch.randint(3, 30, (3, P), generator=g)
    prompt_mask = torch.ones(3, P, dtype=torch.long)
    prompt_mask[1, :2] = 0
    prompts[1, :2] = 0
    rows = torch.tensor([0, 2, 0, 1, 2, 1])
    completion = torch.randint(3, 30, (6, T), generator=g)
    completion_mask = torch.ones(6, T, dtype=torch.long)
    completion_mask[0, 3:] = 0  # ended after 3 tokens
    completion_mask[3, 1:] = 0  # ended after 1 token
    completion[completion_mask == 0] = 0
    ids = torch.cat([prompts[rows], completion], 1)
    mask = torch.cat([prompt_mask[rows], completion_mask], 1)
    return ids, mask, P, completion_mask.bool()


def _hf_logits(model, ids, mask, P):
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits[:, P - 1 : -1]  # [N, T, V]


@pytest.mark.parametrize("kind,hidden,grouped", [("llama", 32, False), ("qwen2", 32, False), ("llama", 1024, False),
                                                 ("llama", 32, True), ("qwen2", 32, True)])
def test_packed_logits_and_gradients_match_the_hf_forward(kind, hidden, grouped, monkeypatch):
    if hidden >= 1024:  # the unfused projections of wide models, on a narrow one
        monkeypatch.setattr(lean_forward, "FUSE_BELOW_HIDDEN", 16)
        hidden = 32
    if grouped:  # completions attend in length-sorted groups whatever the saving
        monkeypatch.setattr(lean_forward, "ATTENTION_SAVING", -1.0)
    model = _model(kind, hidden)
    ids, mask, P, on = _batch()
    assert packable(model)
    groups = lean_forward._Layout(ids, mask, P, 4).groups
    assert len(groups) == (4 if grouped else 1)
    packed = packed_completion_logits(model, ids, mask, P, length_groups=4)
    plain = _hf_logits(model, ids, mask, P)
    assert packed.shape == plain.shape
    assert torch.allclose(packed[on], plain[on], atol=1e-5), (packed[on] - plain[on]).abs().max()
    # a loss on the real positions only: the same gradient for every weight
    weights = torch.randn(plain.shape, generator=torch.Generator().manual_seed(2))
    params = [p for p in model.parameters()]
    g_packed = torch.autograd.grad((packed[on] * weights[on]).sum(), params)
    g_plain = torch.autograd.grad((plain[on] * weights[on]).sum(), params)
    for (name, _), a, b in zip(model.named_parameters(), g_packed, g_plain, strict=True):
        assert torch.allclose(a, b, atol=1e-5), (name, (a - b).abs().max())


def _stem_batch():
    """3 distinct prompts whose real tokens begin with the same 5 (one left-padded by 2, another by 1),
    in 7 rows with completions of unequal length."""
    g = torch.Generator().manual_seed(3)
    P, T = 9, 5
    stem = torch.randint(3, 30, (5,), generator=g)
    own = [torch.randint(3, 30, (k,), generator=g) for k in (4, 2, 3)]  # each prompt's tokens after the stem
    own[1][0] = 3 if own[0][0] != 3 else 4  # the stem ends where the prompts first differ
    own[2][0] = 5 if own[0][0] != 5 and own[1][0] != 5 else 6
    prompts = torch.zeros(3, P, dtype=torch.long)
    prompt_mask = torch.zeros(3, P, dtype=torch.long)
    for i, tail in enumerate(own):
        real = torch.cat([stem, tail])
        prompts[i, P - len(real):], prompt_mask[i, P - len(real):] = real, 1
    rows = torch.tensor([2, 0, 1, 0, 2, 1, 2])
    completion = torch.randint(3, 30, (7, T), generator=g)
    completion_mask = torch.ones(7, T, dtype=torch.long)
    completion_mask[1, 2:] = 0
    completion_mask[5, 1:] = 0
    completion[completion_mask == 0] = 0
    return torch.cat([prompts[rows], completion], 1), torch.cat([prompt_mask[rows], completion_mask], 1), P, \
        completion_mask.bool()


def test_stem_length_counts_the_shared_beginning_of_the_real_tokens():
    ids, mask, P, _ = _stem_batch()
    assert lean_forward.stem_length(ids[:3, :P], mask[:3, :P].bool()) == 5
    # one prompt is the stem plus one token: the stem stops a token short of it
    short = torch.tensor([[0, 0, 7, 8, 9], [7, 8, 9, 4, 5]])
    assert lean_forward.stem_length(short, short > 0) == 2
    assert lean_forward.stem_length(short[:1], short[:1] > 0) == 0  # one prompt: nothing shared
    assert lean_forward.stem_length(torch.tensor([[1, 2], [3, 2]]), torch.ones(2, 2, dtype=torch.bool)) == 0


@pytest.mark.parametrize("grouped", [False, True])
def test_a_shared_stem_runs_once_with_the_hf_forwards_logits_and_gradients(grouped, monkeypatch):
    monkeypatch.setattr(lean_forward, "STEM_FROM", 3)
    if grouped:
        monkeypatch.setattr(lean_forward, "ATTENTION_SAVING", -1.0)
    model = _model("llama")
    ids, mask, P, on = _stem_batch()
    lay = lean_forward._Layout(ids, mask, P, 4)
    assert lay.s == 5 and lay.mp == 4 + 2 + 3  # the stem's tokens once, then each prompt's own
    assert len(lay.ids) == 5 + 9 + int(on[:, :-1].sum())
    packed = packed_completion_logits(model, ids, mask, P, length_groups=4)
    plain = _hf_logits(model, ids, mask, P)
    assert torch.allclose(packed[on], plain[on], atol=1e-5), (packed[on] - plain[on]).abs().max()
    weights = torch.randn(plain.shape, generator=torch.Generator().manual_seed(4))
    params = list(model.parameters())
    g_packed = torch.autograd.grad((packed[on] * weights[on]).sum(), params)
    g_plain = torch.autograd.grad((plain[on] * weights[on]).sum(), params)
    for (name, _), a, b in zip(model.named_parameters(), g_packed, g_plain, strict=True):
        assert torch.allclose(a, b, atol=1e-5), (name, (a - b).abs().max())


def test_a_short_shared_beginning_is_not_split_off(monkeypatch):
    ids, mask, P, _ = _stem_batch()
    assert lean_forward._Layout(ids, mask, P, 1).s == 0  # 5 shared tokens < STEM_FROM
    monkeypatch.setattr(lean_forward, "STEM_FROM", 5)
    assert lean_forward._Layout(ids, mask, P, 1).s == 5


def test_rows_that_all_differ_and_single_token_completions():
    model = _model("llama")
    ids, mask, P, on = _batch()
    rows = [0, 1, 3]  # three distinct prompts
    one = ids[rows, : P + 1], mask[rows, : P + 1]  # one completion token: no completion inputs at all
    assert torch.allclose(packed_completion_logits(model, *one, P), _hf_logits(model, *one, P), atol=1e-5)
    full = ids[rows], mask[rows]
    assert torch.allclose(packed_completion_logits(model, *full, P)[on[rows]],
                          _hf_logits(model, *full, P)[on[rows]], atol=1e-5)


def test_sharded_or_checkpointed_models_are_not_packable():
    model = _model("llama")

    class FullyShardedDataParallel(torch.nn.Module):  # stands in for a strategy's wrapper
        pass

    model.model.layers[0].add_module("wrapped", FullyShardedDataParallel())
    assert not packable(model)
    other = _model("llama")
    next(other.parameters()).ds_id = 0  # DeepSpeed ZeRO-3 marks partitioned parameters
    assert not packable(other)
    checkpointed = _model("llama")
    checkpointed.gradient_checkpointing_enable()
    assert not packable(checkpointed)


def test_attention_groups_only_when_they_save_enough():
    # 7 short rows and one long one: one grid of 8 x 20 x (4 + 20) = 3840; sorted groups of two
    # rows: 2x1x5 + 2x1x5 + 2x2x6 + 2x20x24 = 1004, a saving of 74%
    lengths = torch.tensor([20, 1, 2, 1, 2, 1, 1, 2])
    groups = lean_forward.attention_groups(lengths, 4, 4)
    assert [sorted(lengths[g].tolist()) for g in groups] == [[1, 1], [1, 1], [2, 2], [2, 20]]
    # similar lengths: 8 x 10 x 14 = 1120 vs 2x9x13 x2 + 2x10x14 x2 = 1028, 8% saved: one group
    similar = torch.tensor([9, 10, 9, 10, 9, 10, 9, 10])
    assert [g.tolist() for g in lean_forward.attention_groups(similar, 4, 4)] == [list(range(8))]
    assert [g.tolist() for g in lean_forward.attention_groups(lengths, 4, 1)] == [list(range(8))]


def test_lean_imports_nothing_from_rollout_data_or_rewards():
    """fast_llama/ is used by both rollout and scoring; it must not pull either side in (a fresh interpreter)."""
    import subprocess
    import sys

    code = ("import sys, grpo_aug.fast_llama.decode, grpo_aug.fast_llama.forward; "
            "print(sorted(m for m in sys.modules if m.startswith(('grpo_aug.rollout', 'grpo_aug.data', "
            "'grpo_aug.rewards'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
