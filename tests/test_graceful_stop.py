"""Ctrl-C stops a run after the step in progress, and the run ends as a finished one does: a last
evaluation, last.ckpt, the policy and the summary (callbacks/graceful_stop.py). A second Ctrl-C
stops at once, Lightning's way (exit 1, none of those)."""

import json

import torch

from helpers import TINY, run_train

# reward.timeout_s: the rewards run in a forked child, which the terminal's Ctrl-C reaches too
RUN = ["debug=fast", *TINY, "logger=csv", "trainer.max_steps=40", "reward.timeout_s=30",
       "+callbacks.interrupt._target_=helpers.InterruptAt", "+callbacks.interrupt.step=2"]


def test_ctrl_c_stops_after_the_step_and_keeps_the_run(tmp_path):
    done = run_train(tmp_path, RUN, new_session=True)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    # the interrupt came as step 3 began (global step 2): step 3 ends, nothing after it starts
    assert "stopped by Ctrl-C after step 3 of 40" in text, text[-3000:]
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3
    assert [e["step"] for e in summary["evaluations"]] == [0, 2, 3]  # the interval's, then a last one
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 3
    assert (run / "policy" / "config.json").is_file()
    # the reward child ignored the Ctrl-C: step 3's rows were scored, none timed out or failed
    assert "timed out" not in text and "reward function raised" not in text


def test_a_second_ctrl_c_stops_at_once(tmp_path):
    done = run_train(tmp_path, [*RUN, "+callbacks.interrupt.times=2"], new_session=True)
    text = done.stdout + done.stderr
    assert done.returncode == 1, text[-3000:]
    assert "Detected KeyboardInterrupt" in text
    assert not (tmp_path / "run" / "summary.json").exists()
    assert not (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()
