"""The colocated vLLM engine on a real GPU: weights pushed from the policy, rollouts whose
log-probs match the trainer's. Skipped without CUDA or vLLM; scripts/gpu_check.sh runs it."""

import pytest
import torch

pytestmark = pytest.mark.gpu
vllm = pytest.importorskip("vllm")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


def test_vllm_engine_samples_from_pushed_weights(tmp_path):
    from grpo_aug.lean.logprobs import token_logprobs
    from grpo_aug.models.loading import load_policy, load_tokenizer
    from grpo_aug.rollout.engine import VLLMEngine
    from helpers import build_chat_model

    path = build_chat_model(tmp_path / "m")
    policy, tokenizer = load_policy(str(path)).cuda(), load_tokenizer(str(path))
    engine = VLLMEngine(gpu_memory_utilization=0.2, enforce_eager=True)
    engine.setup(str(path), tokenizer, seed=0)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))  # the engine must sample from these, not the saved ones
    engine.sync(policy, step=1)
    texts = ["Question: 2+2?\nAnswer: "] * 4
    temps = torch.tensor([1.0, 1.0, 0.7, 0.0])
    ro = engine.generate(policy, tokenizer, texts, temps, 1.0, 16,
                         generator=torch.Generator(device="cuda").manual_seed(0))
    with torch.no_grad():
        trainer = token_logprobs(policy, ro.input_ids, ro.attention_mask, ro.prompt_len, ro.temperatures)
    on = ro.completion_mask.bool()
    gap = (trainer[on] - ro.sample_logprobs[on]).abs().mean().item()
    print(f"vllm logprob gap {gap:.4f}")
    assert gap < 0.1
