"""Errors raised on purpose reach the user as one line, the way `python train.py` prints them:
`error: <message>` naming the value and where it came from, exit 1, no traceback, no Hydra
footer. An unexpected exception keeps its traceback."""

import json

import pytest

from grpo_aug.warmup.shipped import STARTS, WEIGHTS
from helpers import TINY, free_port, run_train

FAST = ["debug=fast", *TINY, "logger=csv"]


def _one_line(done, *expected: str) -> str:
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "HYDRA_FULL_ERROR" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), last
    for text in expected:
        assert text in last, last
    return last


def test_a_bad_config_value_is_one_line(tmp_path):
    _one_line(run_train(tmp_path, [*FAST, "model.warmup.lr=-1"]), "model.warmup.lr must be > 0, got -1")


def test_a_checkpoint_cut_in_half_is_one_line(tmp_path):
    cut = tmp_path / "half.ckpt"
    cut.write_bytes((STARTS / "default-seed0" / WEIGHTS).read_bytes()[:5000])
    _one_line(run_train(tmp_path, [*FAST, f"ckpt_path={cut}"]), str(cut), "cut short")


def test_a_bad_data_row_is_one_line_naming_file_and_line(tmp_path):
    rows = tmp_path / "train.jsonl"
    good = {"question": "What is 2 + 3?", "answer": "#### 5"}
    rows.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n" + '{"question": "no answer"\n')
    _one_line(run_train(tmp_path, [*FAST, "data=dataset", f"data.source.path={rows}",
                                   "data.source.tiers=pass_rate"]), f"{rows}:3")


def test_a_tool_that_does_not_import_is_one_line(tmp_path):
    _one_line(run_train(tmp_path, [*FAST, "rollout/tools=functions", "data/prompt_format=chat",
                                   "rollout.tools.functions=[no_such_package.tools.lookup]"]),
              "no_such_package.tools.lookup")


def test_an_unreachable_server_is_one_line(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    _one_line(run_train(tmp_path, [*FAST, "rollout/engine=vllm_server", f"rollout.engine.url={url}",
                                   "rollout.engine.connect_timeout_s=1"]), url)


def test_an_unexpected_exception_keeps_its_traceback(tmp_path):
    done = run_train(tmp_path, [*FAST, "+callbacks.boom._target_=tool_fixtures.Boom"])
    assert done.returncode != 0
    assert "Traceback" in done.stderr or "HYDRA_FULL_ERROR" in done.stderr, done.stderr[-3000:]
    assert "ZeroDivisionError" in done.stderr and "error: " not in done.stderr.strip().splitlines()[-1]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
