"""Evaluation: greedy accuracy, sampled pass@k and mean@k per bucket, and mode=eval on a file
(GSM8K's test split) or on a training checkpoint."""

import json
from collections import Counter

import pytest
import torch

from grpo_aug.data.gsm8k import read_gsm8k
from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.engines.hf import HFEngine
from grpo_aug.models.evaluation import EvalSettings, HeldoutAccuracy, describe
from grpo_aug.models.loading import load_policy, load_tokenizer
from grpo_aug.pipeline import evaluate, train
from helpers import ROOT, TINY, compose_cfg, read_scalars

GSM8K_TEST = ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
EASY = [r for r in SyntheticArithmetic(size_per_bucket=10, seed=0).load() if r.bucket == "easy"][:3]


def test_pass_at_k_and_mean_at_k_by_hand(tiny_model_dir):
    policy, tokenizer = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    acc = HeldoutAccuracy(settings=EvalSettings(samples=4, temperature=1.0))
    # scripted judge: greedy right for prompt 0 only; samples right: prompt 0 once, prompt 1
    # three times, prompt 2 never (calls come greedy first, then 4 samples per prompt in order)
    verdicts = iter([1, 0, 0] + [0, 1, 0, 0] + [1, 1, 0, 1] + [0, 0, 0, 0])
    acc.exact = lambda prompt, text: float(next(verdicts))
    acc.evaluate(HFEngine(), policy, tokenizer, [p.prompt for p in EASY], EASY, 4, seed=0, device=torch.device("cpu"))
    out = acc.compute()
    assert out == pytest.approx({"eval/accuracy/easy": 1 / 3, "eval/pass@4/easy": 2 / 3,
                                 "eval/mean@4/easy": (1 / 4 + 3 / 4 + 0) / 3})
    assert describe(out) == "greedy held-out accuracy: easy 0.333 | pass@4: easy 0.667 | mean@4: easy 0.333"
    assert acc.compute() == {}  # started afresh


def test_evaluation_samples_are_fixed_by_their_seed(tiny_model_dir):
    """Sampling draws from its own seeded generator: the same (seed, step, batch) gives the same
    samples whatever the global random state, so evaluating cannot shift a run's rollouts."""
    policy, tokenizer = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))

    def sampled_texts(seed, global_seed):
        torch.manual_seed(global_seed)
        acc = HeldoutAccuracy(settings=EvalSettings(samples=3, temperature=1.5))
        seen = []
        acc.exact = lambda prompt, text: (seen.append(text), 0.0)[1]
        acc.evaluate(HFEngine(), policy, tokenizer, [p.prompt for p in EASY], EASY, 6, seed=seed,
                     device=torch.device("cpu"))
        return seen[len(EASY):]  # after the greedy ones

    assert sampled_texts(5, 0) == sampled_texts(5, 123)
    assert sampled_texts(5, 0) != sampled_texts(6, 0)


@pytest.mark.skipif(not GSM8K_TEST.exists(), reason="GSM8K is read from ../shared/data/gsm8k")
def test_eval_mode_on_the_first_50_gsm8k_test_problems(tmp_path):
    cfg = compose_cfg(tmp_path, ["mode=eval", *TINY, "model.warmup.steps=0", "data=gsm8k",
                                 f"data.eval_path={GSM8K_TEST}", "eval.limit=50", "eval.samples=2",
                                 "rollout.max_new_tokens=6", "data.val_batch_size=25"])
    metrics = evaluate(cfg)
    result = json.loads((tmp_path / "run" / "eval.json").read_text())
    expected = Counter(r.bucket for r in read_gsm8k(GSM8K_TEST, "{question}")[:50])  # counted independently
    assert result["problems"] == {b: expected[b] for b in ("easy", "medium", "hard")}
    assert sum(result["problems"].values()) == 50
    assert set(result["metrics"]) == {f"eval/{m}/{b}" for m in ("accuracy", "pass@2", "mean@2")
                                      for b in ("easy", "medium", "hard") if expected[b]}
    assert result["metrics"] == metrics and all(0 <= v <= 1 for v in metrics.values())
    scalars = read_scalars(tmp_path / "run")
    assert {k for k in scalars if k.startswith("eval/")} == set(metrics)  # in TensorBoard too


def test_eval_mode_loads_a_training_checkpoint(tmp_path):
    train(compose_cfg(tmp_path / "t", ["debug=fast", *TINY, "logger=csv"]))
    ckpt = tmp_path / "t" / "run" / "checkpoints" / "last.ckpt"
    cfg = compose_cfg(tmp_path / "e", ["mode=eval", "debug=fast", *TINY, f"model.name_or_path={ckpt}", "logger=csv"])
    from grpo_aug.pipeline import build_parts

    module, _, _ = build_parts(cfg)
    trained = load_policy(str(tmp_path / "t" / "run" / "policy"))
    assert all(torch.equal(a, b) for a, b in zip(module.policy.state_dict().values(), trained.state_dict().values(),
                                                 strict=True))
    assert evaluate(cfg).keys() >= {"eval/accuracy/easy"}


def test_eval_path_needs_a_file_source(tmp_path):
    from hydra.errors import InstantiationException

    from grpo_aug.pipeline import build_parts

    with pytest.raises(InstantiationException, match=r"data.eval_path='x.jsonl': the data source "
                                                     r"SyntheticArithmetic reads no files"):
        build_parts(compose_cfg(tmp_path, ["debug=fast", "data.eval_path=x.jsonl"]))
