"""Runs with tools. Under two gloo ranks: rank 1's rows all call the tool in their first segment,
rank 0's (almost) never, so rank 0 must join rank 1's extra rounds. Under FSDP2 every decode
step is a collective: without the vote this hangs, and the 30 s collective timeout fails the run
(checked by disabling the vote). And a run with tools, killed and resumed, equals the whole run."""

import pytest

from helpers import ACCELERATOR, TINY, kill_resume_and_compare, read_scalars, run_train

STRATEGIES = {"ddp": ["trainer=ddp", f"trainer.accelerator={ACCELERATOR}", "trainer.devices=2"],
              "fsdp2": ["trainer=fsdp", f"trainer.accelerator={ACCELERATOR}", "trainer.devices=2",
                        "trainer.precision=32-true"]}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_tool_rounds_on_one_rank_only_finish_under_ddp_and_fsdp2(strategy, tmp_path):
    run = ["debug=fast", *TINY, "rollout/tools=calculator", "rollout.tools.warmup_share=0",
           "rollout.engine._target_=tool_fixtures.ForcedFirstCall", "+rollout.engine.ranks=[1]",
           "rollout.max_new_tokens=16", "trainer.max_steps=4", "trainer.strategy.timeout.seconds=30"]
    out = run_train(tmp_path, [*run, *STRATEGIES[strategy]], timeout=400)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    scalars = read_scalars(tmp_path / "run")
    assert [s for s, _ in scalars["eval/accuracy/easy"]][-1] == 4
    # rank 1: one call per row ([1+1] -> =2); rank 0: its own text, which rarely writes '[...]'
    calls = [v for _, v in scalars["tools/calls_per_row"]]
    assert len(calls) == 4 and all(0.45 <= v <= 0.75 for v in calls), calls


@pytest.mark.slow
def test_a_run_with_tools_killed_and_resumed_equals_the_whole_run(tmp_path):
    """The calculator keeps no state, so a resumed run with tools continues as the whole run did:
    every later train, health, rollout, tools and eval point equal (1e-5)."""
    common = ["debug=fast", *TINY, "rollout/tools=calculator", "rollout.tools.warmup_share=0",
              "rollout.engine._target_=tool_fixtures.ForcedFirstCall", "rollout.max_new_tokens=16",
              "trainer.max_steps=6", "callbacks.checkpoint.every_n_train_steps=3", "callbacks.health.every_n_steps=2"]
    expected, compared = kill_resume_and_compare(tmp_path, common, kill_at=3)
    assert compared > 30
    assert [s for s, _ in expected["tools/calls_per_row"]] == [2, 4, 6]
    assert all(v >= 1.0 for _, v in expected["tools/calls_per_row"])  # every row called at least once
