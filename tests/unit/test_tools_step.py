"""Hostile tools inside a running training step: a tool that raises, one that hangs past its
limit, one that returns 1 MB. The step finishes, the failure is in the transcript and counted,
the tool's tokens carry no loss, and the metrics and alert see it."""

import time

import pytest
import torch
from test_module import fit_batches
from tool_fixtures import ForcedFirstCall

from grpo_aug.callbacks.alerts import StepStats, Thresholds, check
from grpo_aug.callbacks.health import health_values, samples_markdown
from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.rollout.filter import GroupFilter
from grpo_aug.rollout.settings import RolloutSettings
from grpo_aug.tools.protocol import TextTools
from grpo_aug.tools.runner import ToolLimits
from helpers import make_module, make_report, prepared

EASY = [r for r in SyntheticArithmetic(size_per_bucket=40, seed=0).load() if r.bucket == "easy"]


def _step(path, function, limits=None, cap=48):
    tools = TextTools(function=function, max_transcript_tokens=cap, limits=limits or ToolLimits(time_limit_s=0.5))
    m = make_module(path, None, RolloutSettings(group_size=4, temperatures=(0.7, 1.5), top_p=0.95, max_new_tokens=12,
                                                filter=GroupFilter(zero_std=False)),
                    engine=ForcedFirstCall("[1+1]"), tools=tools)
    m.configure_model()
    began = time.monotonic()
    (out,) = fit_batches(m, [EASY[:2]])
    return out, m, time.monotonic() - began


@pytest.mark.parametrize("function, message", [
    ("tool_fixtures.raising", "=error: RuntimeError: cannot handle '1+1'"),
    ("tool_fixtures.sleeping", "=error: timed out after 0.5 s"),
])
def test_a_failing_tool_is_an_error_in_the_transcript_and_counted(tiny_model_dir, function, message):
    out, m, seconds = _step(tiny_model_dir, function)
    report = out["report"]
    assert torch.isfinite(out["updates"].loss).all()
    assert seconds < 20  # one round waited 0.5 s for the hanging call, not its 30 s
    assert report.tool_calls.tolist() == [1] * 8 and report.tool_failures.tolist() == [1] * 8
    values = health_values(report)
    assert values["tools/failure_frequency"][0] == 1.0 and values["tools/call_frequency"][0] == 1.0
    assert values["tools/calls_per_row"][0] == 1.0
    assert 0 < values["tools/token_share"][0] < 1  # the answer's tokens, beside the policy's "[1+1]"
    row = report.samples[0]
    assert row["segments"][0] == ("policy", "[1+1]") and row["segments"][1][0] == "tool"
    assert row["segments"][1][1].startswith(message[: min(len(message), 40)])
    assert "[tool] " + message[:20] in samples_markdown([row]).replace("<br>", "\n")


def test_a_tool_that_returns_a_megabyte_is_cut_and_its_tokens_carry_no_loss(tiny_model_dir):
    out, m, _ = _step(tiny_model_dir, "tool_fixtures.huge", ToolLimits(max_output_chars=30), cap=48)
    report = out["report"]
    assert report.tool_failures.sum() == 0 and report.tool_calls.tolist() == [1] * 8
    # '=' + 30 characters (cut, marked), within the 48-token transcript
    assert report.row_tokens.max() <= 48 and report.tool_tokens.tolist() == [31] * 8
    assert report.samples[0]["segments"][1][1] == "=" + "7" * 22 + "...[cut]"
    # lengths count the policy's tokens; the loss mask holds none of the tool's
    assert report.lengths.tolist() == (report.row_tokens - report.tool_tokens).tolist()
    step = prepared(m, EASY[:2])
    assert step.mask.sum() > 0 and not (step.mask.bool() & step.rollout.given).any()
    assert step.mask.sum() <= step.rollout.written.sum()


def test_the_tool_failures_alert_fires_past_its_share():
    t = Thresholds(max_tool_failures=0.25)
    calm = [StepStats(1, 0.5, 0, 1, 0.01, 1, 1, 0, 1, 1, 0, tool_calls=10, tool_failures=2)] * 10
    assert "tool_failures" not in check(calm, t)
    bad = calm[:5] + [StepStats(1, 0.5, 0, 1, 0.01, 1, 1, 0, 1, 1, 0, tool_calls=10, tool_failures=8)] * 5
    assert "50.0% of tool calls failed" in check(bad, t)["tool_failures"]
    assert "tool_failures" not in check([s._replace(tool_calls=0, tool_failures=0) for s in bad], t)


def test_tool_metrics_of_mixed_rows_by_hand():
    """Four rows calling 2, 0, 1 and 3 times, one call failing: every metric differs, so a swapped
    numerator, a per-call count where a per-row one belongs or an unweighted share shows."""
    report = make_report([[1.0, 0.0, 1.0, 0.0]], tool_calls=torch.tensor([2, 0, 1, 3]),
                         tool_failures=torch.tensor([0, 0, 1, 0]), tool_tokens=torch.tensor([6, 0, 2, 9]),
                         row_tokens=torch.tensor([12, 5, 8, 10]))
    values = health_values(report)
    got = {name: (float(v), float(w)) for name, (v, w) in values.items() if name.startswith("tools/")}
    assert got["tools/call_frequency"] == (0.75, 4.0)  # 3 of 4 rows called, weighed by rows
    assert got["tools/calls_per_row"] == (1.5, 4.0)  # 6 calls / 4 rows
    assert got["tools/failure_frequency"][0] == pytest.approx(1 / 6)  # 1 of 6 calls
    assert got["tools/failure_frequency"][1] == 6.0  # weighed by calls, not rows
    # per row 6/12, 0/5, 2/8, 9/10, then their mean (not 17 / 35 over the step)
    assert got["tools/token_share"][0] == pytest.approx((0.5 + 0.0 + 0.25 + 0.9) / 4)
    assert got["tools/token_share"][1] == 4.0
