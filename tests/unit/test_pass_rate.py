"""data.source.tiers=pass_rate: rates from k samples of the starting policy, buckets by threshold."""

import json
import logging
from collections import defaultdict

import pytest

from grpo_aug.data.prompt_format import PlainPrompt
from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.engines.hf import HFEngine
from grpo_aug.models.loading import load_policy, load_tokenizer
from grpo_aug.pipeline import build_parts
from grpo_aug.prompts.pass_rate import pass_rates, tier
from helpers import compose_cfg

RECORDS = SyntheticArithmetic(size_per_bucket=4, seed=0).load()[:5]


def test_tier_thresholds():
    assert [tier(r, 0.7, 0.2) for r in (1.0, 0.7, 0.69, 0.21, 0.2, 0.0)] == \
        ["easy", "easy", "medium", "medium", "hard", "hard"]


def test_pass_rate_is_the_share_of_the_k_samples_scored_right(tiny_model_dir):
    policy, tokenizer = load_policy(str(tiny_model_dir), "float32"), load_tokenizer(str(tiny_model_dir))
    right = {r.id: i for i, r in enumerate(RECORDS)}  # record i: its first i samples count as right
    seen = defaultdict(int)

    def correct(record, text):
        seen[record.id] += 1
        return 1.0 if seen[record.id] <= right[record.id] else 0.0

    rates = pass_rates(HFEngine(), policy, tokenizer, PlainPrompt(), correct, RECORDS, samples=4, temperature=1.0,
                       max_new_tokens=3, prompts_per_batch=2)
    assert rates == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert all(n == 4 for n in seen.values())


def test_a_dataset_run_is_tiered_by_the_starting_policy_before_training(tmp_path, caplog):
    rows = [{"question": r.question, "answer": r.answer, "id": r.id}
            for r in SyntheticArithmetic(size_per_bucket=8, seed=0).load()]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fast = ["trainer.max_steps=4", "data.batch_size=2", "rollout.group_size=4", "rollout.max_new_tokens=4",
            "model.warmup.steps=0"]  # debug=fast's sizes, without its synthetic-data key
    overrides = ["data=dataset", f"data.source.path={path}", "data.source.tiers=pass_rate",
                 "data.source.pass_rate_samples=2", "data.source.prompt_template='Q: {question}\nA: '",
                 "data.heldout_per_bucket=2", "model.tiny.hidden_size=32", "model.tiny.num_layers=2",
                 "model.tiny.num_heads=2", "model.tiny.intermediate_size=64"]
    cfg = compose_cfg(tmp_path, [*fast, *overrides])
    caplog.set_level(logging.INFO)
    # a random-weight policy solves nothing: every prompt is hard, and a one-bucket curriculum,
    # which may draw easy, stops the run before training with the counts in the log (mixed batches,
    # the default, pass an empty bucket's slots to its neighbours instead)
    one_bucket = compose_cfg(tmp_path, [*fast, *overrides, "data.mix_buckets=false"])
    with pytest.raises(ValueError, match="bucket 'easy'"):
        build_parts(one_bucket)
    assert "tiers=pass_rate (training, 22 prompts): easy 0  medium 0  hard 22; no sample right: 22" in caplog.text
    assert "tiers=pass_rate (held-out, 2 prompts)" in caplog.text
    _, data, _ = build_parts(cfg)  # mixed batches: every slot goes to hard, the one bucket with prompts
    first = next(iter(data.make_sampler(0, 0, 1)))
    assert len(first) == 2 and {b for _, b in first} == {"hard"}
