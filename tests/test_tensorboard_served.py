"""TensorBoard end to end: a short run, then `tensorboard --logdir <run>` on a free localhost port,
read back through its HTTP data API as the browser reads it: every tag docs/health.md lists is
served with the values the run wrote, the text samples are served, and the custom-scalar first
page is there."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
import time
import urllib.parse
import urllib.request
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from grpo_aug.dashboard import CHARTS
from helpers import ROOT, TINY, read_scalars, run_train

# tags of docs/health.md a run writes only under some condition, and why this run has none
CONDITIONAL = {
    "rollout/temperature_max": "callbacks=[default,adaptive_temperature] only",
    "rollout/temperature_count": "callbacks=[default,adaptive_temperature] only",
    "reward/timeouts/math": "reward.timeout_s set only",
    "tools/call_frequency": "rollout/tools only",
    "tools/calls_per_row": "rollout/tools only",
    "tools/failure_frequency": "rollout/tools only",
    "tools/token_share": "rollout/tools only",
    "rollout/staleness": "rollout.ahead >= 1 only",
    "rollout/stale_rows": "rollout.ahead >= 1 only",
    "rollout/stale_rows_total": "rollout.ahead >= 1 only",
}
OPTIONS = ["debug=fast", *TINY, "trainer.max_steps=6", "rollout.filter.zero_std=false", "prompts/difficulty=online",
           "rollout.oversample=2", "prompts/selector=learned",
           "prompts.selector.predictor.warmup_groups=2", "callbacks.alerts.window=2",
           "callbacks.alerts.low_std=0.9", "callbacks.alerts.high_std=5"]


def documented_tags() -> set[str]:
    """The first column of docs/health.md's table, placeholders expanded for this run."""
    table = [line.split("|")[1] for line in (ROOT / "docs" / "health.md").read_text().splitlines()
             if line.startswith("| `")]
    tags = set()
    for cell in table:
        for tag in re.findall(r"`([a-z_]+/[^`]+)`", cell):
            tag = tag.replace("<name>", "math").replace("<T>", "0.7")
            for bucket in ("easy", "medium", "hard"):
                tags.add(tag.replace("<bucket>", bucket))
    return tags


def load_script():
    """scripts/tensorboard_screenshot.py as a module: its server start and its screenshot."""
    path = ROOT / "scripts" / "tensorboard_screenshot.py"
    spec = importlib.util.spec_from_file_location("tensorboard_screenshot", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Board:
    """A TensorBoard server on the run, started by the script, answered through its HTTP data API."""

    def __init__(self, logdir: Path) -> None:
        self.proc, self.port = load_script().serve(logdir)

    def get(self, path: str, **query):
        url = f"http://127.0.0.1:{self.port}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())

    def wait_for(self, path: str, ready, timeout: float = 60.0):
        """Poll `path` until ready(answer): the server goes on loading the event files after it starts."""
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            last = self.get(path)
            if ready(last):
                return last
            time.sleep(0.5)
        raise AssertionError(f"{path} never ready within {timeout} s; last answer: {str(last)[:1000]}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.mark.slow
def test_tensorboard_serves_the_run(tmp_path):
    result = run_train(tmp_path, OPTIONS)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    written = read_scalars(run)
    expected = documented_tags()
    assert len(expected) > 50, "docs/health.md's table was not read"
    board = Board(run)
    try:
        runs = board.wait_for("/data/runs", lambda r: "tensorboard" in r)
        assert runs == ["tensorboard"]
        served = board.wait_for("/data/plugin/scalars/tags",
                                lambda t: "eval/accuracy/easy" in t.get("tensorboard", {}))["tensorboard"]
        # a tag named by its parts (curriculum/moved/<from>_<to>): some served tag has that shape
        patterns = {t for t in expected if "<" in t}
        for pattern in patterns:
            regex = re.compile(re.sub(r"<[a-z]+>", "[a-z]+", pattern) + "$")
            assert any(regex.match(t) for t in served), pattern
        expected -= patterns
        missing = sorted(t for t in expected if t not in served and not t.startswith("alerts/")
                         and t not in CONDITIONAL)
        assert not missing, f"documented in docs/health.md but not served: {missing}"
        stale = set(CONDITIONAL) & set(served)
        assert not stale, f"listed as conditional but served: {sorted(stale)}"
        assert set(CONDITIONAL) <= expected, "a conditional tag docs/health.md no longer lists"
        # the alert this run's thresholds make fire (a window of 2 steps, low_std 0.9)
        assert "alerts/low_std" in served
        for tag in sorted(t for t in expected if t in served) + ["alerts/low_std"]:
            points = board.get("/data/plugin/scalars/scalars", run="tensorboard", tag=tag)
            got = [(step, value) for _, step, value in points]
            want = written[tag]
            assert [s for s, _ in got] == [s for s, _ in want], tag
            assert all(math.isclose(g, w, rel_tol=1e-6, abs_tol=1e-7) or (math.isnan(g) and math.isnan(w))
                       for (_, g), (_, w) in zip(got, want, strict=True)), tag
        texts = board.wait_for("/data/plugin/text/tags", lambda t: bool(t.get("tensorboard")))["tensorboard"]
        samples = [t for t in texts if t.startswith("samples/")]
        assert samples, texts
        shown = board.get("/data/plugin/text/text", run="tensorboard", tag=samples[0])
        assert shown and "Q: What is" in shown[-1]["text"] and "reward" in shown[-1]["text"]
        layout = board.get("/data/plugin/custom_scalars/layout")
        (category,) = layout["category"]
        assert category["title"] == "grpo-aug: first page"
        charts = {c["title"]: c["multiline"]["tag"] for c in category["chart"]}
        assert charts == {title: [f"^{t}$" for t in tags] for title, tags in CHARTS}
        # each chart's tags are served by the scalars plugin (a layout pointing at nothing is blank)
        for title, tags in CHARTS:
            assert any(t in served for t in tags), title
        plugins = board.get("/data/plugins_listing")
        assert all(plugins[name]["enabled"] for name in ("scalars", "text", "custom_scalars", "histograms"))
    finally:
        board.stop()
    assert board.proc.returncode is not None


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="no headless Chromium (apt-get install chromium)")
def test_first_page_screenshot_is_not_blank(tmp_path):
    """Where Debian's chromium is installed: the script's screenshot of the first page, and its blank
    check, which a page without the run's charts fails."""
    result = run_train(tmp_path, ["debug=fast", *TINY, "trainer.max_steps=6", "rollout.filter.zero_std=false"])
    assert result.returncode == 0, result.stderr[-3000:]
    script = load_script()
    png = script.screenshot(tmp_path / "run", tmp_path / "page.png")
    assert png.stat().st_size > 20_000 and not script.blank(png)
    white = tmp_path / "white.png"
    matplotlib.image.imsave(white, np.ones((50, 50, 3)))
    assert script.blank(white)
