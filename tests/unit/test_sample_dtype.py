"""bf16 copies for the forwards that need no gradient: the rollout's sampling copy
(rollout.engine.sample_dtype) follows the policy's weights at every rollout, the reference
(model.reference_dtype) is cast once; both keep their float32 buffers (RoPE frequencies)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpo_aug.engines.hf import HFEngine
from grpo_aug.engines.sampling import generate
from grpo_aug.errors import UsageError
from grpo_aug.models.loading import frozen_copy
from grpo_aug.models.tiny import build_char_tokenizer


def _policy(tok):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    return LlamaForCausalLM(config)


def test_the_sampling_copy_follows_the_policy_and_samples_as_a_bf16_model_would():
    tok = build_char_tokenizer()
    policy = _policy(tok)
    engine = HFEngine(sample_dtype="bfloat16")
    copy = engine.sampler(policy)
    assert copy is not policy and all(p.dtype == torch.bfloat16 for p in copy.parameters())
    assert copy.model.rotary_emb.inv_freq.dtype == torch.float32
    with torch.no_grad():  # an optimizer step on the policy
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    assert engine.sampler(policy) is copy  # the same copy, overwritten
    for mine, theirs in zip(copy.parameters(), policy.parameters(), strict=True):
        assert torch.equal(mine, theirs.to(torch.bfloat16))
    assert all(p.dtype == torch.float32 for p in policy.parameters())  # the policy itself untouched
    prompts = ["Q: What is 4 + 5?\nA: ", "Q: 7?\nA: "]
    greedy = torch.zeros(2)
    by_engine = engine.generate(policy, tok, prompts, greedy, 1.0, 10)
    cast = _policy(tok)
    cast.load_state_dict(policy.state_dict())
    for p in cast.parameters():
        p.data = p.data.to(torch.bfloat16)
    assert by_engine.texts == generate(cast, tok, prompts, greedy, 1.0, 10).texts


def test_without_sample_dtype_the_policy_samples_itself():
    tok = build_char_tokenizer()
    policy = _policy(tok)
    assert HFEngine().sampler(policy) is policy
    with pytest.raises(UsageError, match="rollout.engine.sample_dtype.*'bf16'"):
        HFEngine(sample_dtype="bf16")


def test_the_reference_in_bf16_keeps_float32_buffers():
    tok = build_char_tokenizer()
    policy = _policy(tok)
    ref = frozen_copy(policy, "bfloat16")
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in ref.parameters())
    assert ref.model.rotary_emb.inv_freq.dtype == torch.float32
    assert torch.equal(ref.lm_head.weight, policy.lm_head.weight.to(torch.bfloat16))
    with pytest.raises(UsageError, match="model.reference_dtype"):
        frozen_copy(policy, "half")
