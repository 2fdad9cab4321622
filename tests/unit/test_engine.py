"""Rollout engines: the hf engine's own log-probs agree with the trainer's; a Rollout built from
token id lists keeps the padding conventions; the vLLM engine's request and result handling,
checked against a stand-in for the vllm package (the real engine runs in tests/with_vllm, on CUDA
under scripts/gpu_check.sh)."""

import sys
import types

import pytest
import torch

from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.engines.hf import HFEngine
from grpo_aug.engines.types import rollout_from_ids
from grpo_aug.engines.vllm_colocated import VLLMEngine
from grpo_aug.fast_llama.logprobs import token_logprobs
from grpo_aug.models.loading import load_policy, load_tokenizer
from helpers import TINY, read_scalars, train_here

EASY = [r for r in SyntheticArithmetic(size_per_bucket=10, seed=0).load() if r.bucket == "easy"]


def test_hf_engine_sample_logprobs_equal_a_separate_hf_forward(tiny_model_dir):
    model, tokenizer = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    temps = torch.tensor([0.0, 0.7, 1.0, 1.5] * 2)
    torch.manual_seed(0)
    ro = HFEngine().generate(model, tokenizer, [p.prompt for p in EASY[:2] for _ in range(4)], temps, 1.0, 8)
    setattr(model, "grpo_aug_lean", False)  # the reference: the model's own HF forward
    with torch.no_grad():
        expected = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.prompt_len, ro.temperatures)
    on = ro.completion_mask.bool()
    assert torch.allclose(ro.sample_logprobs[on], expected[on], atol=1e-4)
    assert torch.equal(ro.sample_logprobs[~on], torch.zeros_like(ro.sample_logprobs[~on]))


def test_a_run_logs_the_gap_between_sampler_and_trainer(tmp_path):
    train_here(tmp_path, ["debug=fast", *TINY, "rollout.filter.zero_std=false"])
    gaps = [v for _, v in read_scalars(tmp_path / "run")["rollout/logprob_gap"]]
    assert gaps and all(0 <= g < 1e-3 for g in gaps)  # fp32, the same weights: rounding only


def test_rollout_from_token_id_lists():
    ro = rollout_from_ids([[1, 2], [3]], [[5, 2], [6, 7, 8]], [[-0.5, -0.1], [-1.0, -2.0, -3.0]],
                          torch.tensor([1.0, 0.7]), ["a", "b"], [True, False], pad_id=0)
    assert ro.prompt_len == 2 and ro.input_ids.tolist() == [[1, 2, 5, 2, 0], [0, 3, 6, 7, 8]]
    assert ro.attention_mask.tolist() == [[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]]
    assert ro.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert ro.truncated.tolist() == [False, True]
    assert ro.sample_logprobs.flatten().tolist() == pytest.approx([-0.5, -0.1, 0.0, -1.0, -2.0, -3.0])


class _Params:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


def _fake_vllm(calls):
    """A stand-in `vllm` module: LLM.generate echoes a scripted completion per request."""

    class LLM:
        def __init__(self, **kwargs):
            calls["init"] = kwargs

        def generate(self, prompts, params, use_tqdm=False):
            calls["generate"] = (prompts, params)
            out = []
            for i, _ in enumerate(prompts):
                ids = [4 + i, 2] if i % 2 == 0 else [4, 5, 6]
                logprobs = [{t: types.SimpleNamespace(logprob=-0.25 * (k + 1))} for k, t in enumerate(ids)]
                done = types.SimpleNamespace(token_ids=ids, logprobs=logprobs, text=f"c{i}",
                                             finish_reason="stop" if i % 2 == 0 else "length")
                out.append(types.SimpleNamespace(outputs=[done]))
            return out

    return types.SimpleNamespace(LLM=LLM, SamplingParams=_Params)


def test_vllm_engine_requests_per_row_sampling_and_builds_the_rollout(tiny_model_dir, monkeypatch):
    calls = {}
    monkeypatch.setitem(sys.modules, "vllm", _fake_vllm(calls))
    engine = VLLMEngine(gpu_memory_utilization=0.25)
    tokenizer = load_tokenizer(str(tiny_model_dir))
    engine.setup(str(tiny_model_dir), tokenizer, seed=3)
    assert calls["init"]["gpu_memory_utilization"] == 0.25 and calls["init"]["seed"] == 3
    assert calls["init"]["logprobs_mode"] == "processed_logprobs"  # after temperature, as the trainer scores
    policy = load_policy(str(tiny_model_dir))
    texts = ["Q: 1+1\nA: ", "Q: 22+3\nA: "]
    ro = engine.generate(policy, tokenizer, texts, torch.tensor([0.0, 1.2]), 0.9, 5,
                         generator=torch.Generator().manual_seed(0))
    prompts, params = calls["generate"]
    assert [p["prompt_token_ids"] for p in prompts] == tokenizer(texts, add_special_tokens=False).input_ids
    assert [p.kwargs["temperature"] for p in params] == pytest.approx([0.0, 1.2])
    assert [(p.kwargs["top_p"], p.kwargs["max_tokens"]) for p in params] == [(1.0, 5), (0.9, 5)]  # greedy: no top-p
    assert len({p.kwargs["seed"] for p in params}) == 2
    assert ro.texts == ["c0", "c1"] and ro.truncated.tolist() == [False, True]
    assert ro.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert ro.sample_logprobs.tolist() == [[-0.25, -0.5, 0.0], [-0.25, -0.5, -0.75]]


def test_the_hf_engine_captures_its_decode_only_where_asked_and_on_cuda(monkeypatch):
    import types

    import grpo_aug.engines.hf as hf

    asked = []
    monkeypatch.setattr(hf, "generate", lambda *a, **kw: asked.append(kw["static"]))

    def policy(cuda: bool):
        return types.SimpleNamespace(parameters=lambda: iter([types.SimpleNamespace(is_cuda=cuda)]))

    for engine, cuda in [(HFEngine(), True), (HFEngine(captured_decode=True), False),
                         (HFEngine(captured_decode=True), True)]:
        engine.generate(policy(cuda), None, ["x"], torch.ones(1), 1.0, 4)
    assert asked == [False, False, True]
