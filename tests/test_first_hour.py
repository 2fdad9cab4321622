"""What a newcomer sees: `python train.py` on a terminal and off one (CI, nohup): a progress line
that counts optimizer steps to trainer.max_steps and never an epoch, none of the known third-party
noise, and a summary that says what the run did (checked against the run's own event files)."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys

import pytest

from helpers import ROOT, TINY, read_scalars, run_train

NOISE = ["Loading weights", "Writing model shards", "litlogger", "LeafSpec", "transfer_batch_to_device",
         "`weights_only` was not set", "Epoch "]


def run_on_terminal(tmp_path, overrides: list[str]) -> tuple[int, str]:
    """`python train.py` with a pseudo-terminal as stdout and stderr; everything it wrote."""
    main, child = pty.openpty()
    args = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={tmp_path}/run",
            f"paths.cache_dir={tmp_path}/cache", *overrides]
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200")  # a wide terminal: the line is not cut
    proc = subprocess.Popen(args, cwd=ROOT, stdout=child, stderr=child, env=env)
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed its side
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    return proc.wait(timeout=300), b"".join(chunks).decode(errors="replace")


def test_terminal_line_counts_optimizer_steps_and_no_epoch(tmp_path):
    # two updates per rollout: 2 rollouts, 4 optimizer steps; the line counts the optimizer steps
    code, out = run_on_terminal(tmp_path, ["debug=fast", *TINY, "algo.num_iterations=2"])
    assert code == 0, out[-3000:]
    lines = re.findall(r"\r\x1b\[2K(GRPO [^\r\n]*)", out)
    assert lines, out[-2000:]
    counts = [re.match(r"GRPO  (\d+)/(\d+)", line).groups() for line in lines]
    assert {total for _, total in counts} == {"4"}  # the total is trainer.max_steps
    assert [int(done) for done, _ in counts][:2] == [2, 4] and counts[-1] == ("4", "4")
    assert "bucket " in lines[0] and "reward " in lines[0] and "eval @0 easy" in lines[0]
    assert "ETA" in lines[0] and "s/step" in lines[0]
    assert not re.search(r"Epoch \d+/-\d+", out)
    for noise in NOISE:
        assert noise not in out, noise
    assert "run summary: 4 GRPO steps" in out


def test_off_a_terminal_plain_lines_and_a_summary_from_the_run(tmp_path):
    # no selector and no filter: every step rolls out the same 8 rows, and rollout/flat_rows_frac is
    # written every step (debug=fast: log_every_n_steps=1), so the run's share is those points' mean
    result = run_train(tmp_path, ["debug=fast", *TINY, "trainer.max_steps=6", "rollout.filter.zero_std=false",
                                  "prompts/selector=none"])
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    assert "\x1b[2K" not in out  # no terminal control off a terminal
    assert re.search(r"\[grpo_aug.progress\]\[INFO\] - GRPO  6/6  100%  [\d.]+ s/step  ETA 0:00", out)
    for noise in NOISE:
        assert noise not in out, noise
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    scalars = read_scalars(run)
    for bucket in ("easy", "medium", "hard"):
        points = scalars[f"eval/accuracy/{bucket}"]  # (0, 2, 4, 6): start at 0, final over 2, 4, 6
        assert [s for s, _ in points] == [0, 2, 4, 6]
        row = summary["accuracy"][bucket]
        assert row["start"] == pytest.approx(points[0][1])
        assert row["final"] == pytest.approx(sum(v for _, v in points[1:]) / 3)
        assert row["final_steps"] == [2, 4, 6]
    seconds = summary["seconds"]
    assert seconds["grpo"] > 0 and seconds["evaluation"] > 0  # 6 steps and 4 evaluations ran
    assert seconds["warmup"] + seconds["grpo"] + seconds["evaluation"] <= seconds["total"]  # parts of one whole
    # every step's phases went to TensorBoard, and the summary totals them: within the steps' own time
    phases = summary["phase_seconds"]
    assert set(phases) == {"rollout", "reference", "update"}
    for phase, total in phases.items():
        points = scalars[f"time/{phase}_s"]
        assert [s for s, _ in points] == [1, 2, 3, 4, 5, 6] and all(v > 0 for _, v in points)
        assert total == pytest.approx(sum(v for _, v in points), rel=1e-5)
    assert sum(phases.values()) <= seconds["grpo"]
    flat = [v for _, v in scalars["rollout/flat_rows_frac"]]
    assert len(flat) == 6 and summary["flat_rows_frac"] == pytest.approx(sum(flat) / 6)
    assert summary["steps"] == 6
    assert (run / "health.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert summary["tensorboard_command"] == f"tensorboard --logdir {run / 'tensorboard'}"
    assert f"view it:     tensorboard --logdir {run / 'tensorboard'}" in out


def test_verbose_gives_the_library_output_back(tmp_path):
    result = run_train(tmp_path, ["debug=fast", *TINY, "trainer.max_steps=1", "verbose=true"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "litlogger" in result.stdout + result.stderr


def test_quiet_keeps_the_hub_download_bar():
    # transformers' disable_progress_bar() turns huggingface_hub's bars off too; a download from the
    # hub can take minutes, so its bar comes back on
    code = ("from grpo_aug.quiet import quiet_defaults; quiet_defaults()\n"
            "from huggingface_hub.utils import are_progress_bars_disabled\n"
            "from transformers.utils.logging import is_progress_bar_enabled\n"
            "print(is_progress_bar_enabled(), are_progress_bars_disabled())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
