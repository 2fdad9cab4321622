"""Each alert fires on constructed statistics, stays silent on healthy ones, and fail_on stops."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from grpo_aug.callbacks.alerts import AlertFailure, Alerts, StepStats, Thresholds, check, step_stats
from helpers import Recorder, make_report

T = Thresholds()
HEALTHY = StepStats(reward_std=0.45, reward_mean=0.5, reward_min=0.0, reward_max=1.0, kl_mean=0.02,
                    effective_ratio=0.9, polarisation=2.0, nonfinite=0.0, max_temperature=1.5)


def window(n=10, **last):
    return [HEALTHY] * (n - 1) + [HEALTHY._replace(**last)]


def test_healthy_window_is_silent():
    assert check([HEALTHY] * 10, T) == {}


def test_low_std_names_the_likely_cause():
    greedy = [HEALTHY._replace(reward_std=0.0, max_temperature=0.0)] * 10
    assert "near-greedy" in check(greedy, T)["low_std"]
    flat = [HEALTHY._replace(reward_std=0.0, reward_min=1.0, reward_max=1.0, reward_mean=1.0)] * 10
    assert "the reward has no spread: every completion scored 1" in check(flat, T)["low_std"]
    hard = [HEALTHY._replace(reward_std=0.05, reward_mean=0.01)] * 10
    assert "too hard" in check(hard, T)["low_std"]
    agree = [HEALTHY._replace(reward_std=0.1)] * 10
    assert "agree" in check(agree, T)["low_std"]
    assert set(check(agree, T)) == {"low_std"}


def test_high_std_kl_spike_tokens_polarisation_nonfinite():
    assert "winsorize" in check([HEALTHY._replace(reward_std=2.5)] * 10, T)["high_std"]
    spike = check(window(kl_mean=0.2), T)  # 10x the median 0.02
    assert set(spike) == {"kl_spike"} and "median 0.0200" in spike["kl_spike"]
    assert check(window(kl_mean=0.09), T) == {}  # 4.5x: below the factor 5
    # from ~0 to 0.04 as training starts: judged against the floor 0.01, not the median 0
    assert check([HEALTHY._replace(kl_mean=0.0)] * 9 + [HEALTHY._replace(kl_mean=0.04)], T) == {}
    assert "only 0.30" in check([HEALTHY._replace(effective_ratio=0.3)] * 10, T)["low_effective_tokens"]
    assert "p90/p10 = 12.0" in check([HEALTHY._replace(polarisation=12.0)] * 10, T)["length_polarisation"]
    assert set(check(window(nonfinite=1.0), T)) == {"non_finite_loss"}


def test_junk_tokens_names_the_share_and_the_likely_cause():
    junky = check([HEALTHY._replace(junk=0.05)] * 10, T)
    assert set(junky) == {"junk_tokens"} and "5.0% of completion characters" in junky["junk_tokens"]
    assert "tokenizer" in junky["junk_tokens"]
    assert check([HEALTHY._replace(junk=0.01)] * 10, T) == {}  # below max_junk 0.02
    report = make_report([[1.0, 0.0]], junk_chars=torch.tensor(2.0), completion_chars=torch.tensor(8.0))
    assert StepStats(*step_stats(report).tolist()).junk == 0.25


def test_steps_without_an_update_neither_drag_the_kl_median_nor_count_as_junk():
    # every other step had all its groups filtered out (no loss token, KL reported 0)
    empty = HEALTHY._replace(kl_mean=0.0, loss_tokens=0.0, effective_ratio=1.0)
    steps = [HEALTHY._replace(kl_mean=0.05, loss_tokens=100.0), empty] * 4 + [empty]
    assert "kl_spike" not in check(steps + [HEALTHY._replace(kl_mean=0.2, loss_tokens=100.0)], T)  # 4x 0.05
    assert "kl_spike" in check(steps + [HEALTHY._replace(kl_mean=0.3, loss_tokens=100.0)], T)  # 6x 0.05
    report = make_report([[1.0, 1.0], [0.0, 1.0]], loss_tokens=torch.tensor(0.0), generated_tokens=torch.tensor(0.0))
    assert StepStats(*step_stats(report).tolist()).effective_ratio == 1.0  # nothing entered, nothing masked


def test_step_stats_by_hand():
    out = make_report([[1.0, 0.0], [1.0, 1.0]], [0.7, 1.5, 0.7, 1.5], lengths=torch.tensor([2.0, 4.0, 6.0, 8.0]),
                      kl_mean=torch.tensor(0.1), loss_tokens=torch.tensor(10.0), generated_tokens=torch.tensor(20.0))
    s = StepStats(*step_stats(out).tolist())
    assert s.reward_std == pytest.approx(0.7071 / 2, rel=1e-3) and s.reward_mean == 0.75
    assert (s.reward_min, s.reward_max, s.max_temperature) == (0.0, 1.0, 1.5)
    assert s.effective_ratio == pytest.approx(0.5)
    assert s.polarisation == pytest.approx(7.4 / 2.6, rel=1e-4)  # p90 = 7.4, p10 = 2.6 over 2, 4, 6, 8
    # an unscorable row (stored as 0) is neither a reward of 0 nor part of its group's std:
    # group 1 counts only its 1.0 row (no std), group 2 is flat; mean over the 3 scored rows is 1
    mask = torch.tensor([[True, False], [True, True]])
    s = StepStats(*step_stats(dataclasses.replace(out, scored=mask, counted=mask)).tolist())
    assert (s.reward_std, s.reward_mean, s.reward_min, s.reward_max) == (0.0, 1.0, 1.0, 1.0)


class FakeStrategy:
    def reduce(self, t, reduce_op):
        return t


def _trainer(step, loggers=()):
    return SimpleNamespace(global_step=step, strategy=FakeStrategy(), loggers=list(loggers), is_global_zero=True)


def _flat_outputs(**over):
    return {"report": make_report(torch.ones(2, 4), lengths=torch.full((8,), 5.0), loss_tokens=torch.tensor(40.0),
                                  **over)}


def test_callback_fires_once_per_window_counts_and_fails_on_request():
    rec = Recorder()
    cb = Alerts(window=3, fail_on=())
    for step in range(1, 8):
        cb.on_train_batch_end(_trainer(step, [rec]), None, _flat_outputs(), None, 0)
    fired = [(s, v) for s, v in rec.logged if "alerts/low_std" in v]
    assert [s for s, _ in fired] == [3, 6] and [v["alerts/low_std"] for _, v in fired] == [1.0, 2.0]
    stopper = Alerts(window=3, fail_on=["low_std"])
    with pytest.raises(AlertFailure, match="alert low_std: .* every completion scored 1"):
        for step in range(1, 4):
            stopper.on_train_batch_end(_trainer(step), None, _flat_outputs(), None, 0)
    nonfinite = Alerts(window=5, fail_on=["non_finite_loss"])  # does not wait for a full window
    with pytest.raises(AlertFailure, match="non_finite_loss"):
        nonfinite.on_train_batch_end(_trainer(1), None, _flat_outputs(nonfinite=torch.tensor(1.0)), None, 0)


def test_bad_alert_config_names_the_key():
    with pytest.raises(ValueError, match="fail_on has unknown alert"):
        Alerts(fail_on=["loss_went_down"])
    with pytest.raises(ValueError, match="unknown key"):
        Alerts(low_sdt=0.3)


def test_heldout_below_start_fires_on_the_bucket_that_fell_and_keeps_its_start_on_resume(caplog):
    rec = Recorder()
    cb = Alerts(window=3)
    start = {"eval/accuracy/easy": 0.34, "eval/accuracy/medium": 0.25, "eval/accuracy/hard": 0.165}
    cb.on_validation_end(_trainer(0, [rec]), SimpleNamespace(last_eval=start))
    # medium 0.01 below: within the threshold; hard 0.045 below: fires, naming hard only
    later = {"eval/accuracy/easy": 0.54, "eval/accuracy/medium": 0.24, "eval/accuracy/hard": 0.12,
             "eval/pass@8/hard": 0.0}
    resumed = Alerts(window=3)
    resumed.load_state_dict(cb.state_dict())
    for alerts in (cb, resumed):
        alerts.on_validation_end(_trainer(100, [rec]), SimpleNamespace(last_eval=later))
    fired = [v["alerts/heldout_below_start"] for _, v in rec.logged if "alerts/heldout_below_start" in v]
    assert fired == [1.0, 1.0]
    texts = [r.getMessage() for r in caplog.records if "heldout_below_start" in r.getMessage()]
    assert len(texts) == 2 and all("below its start: hard 0.120 (start 0.165), while" in t for t in texts), texts
    quiet = Alerts(window=3)  # no step-0 evaluation (validate_before_training=false): never fires
    quiet.on_validation_end(_trainer(50, [rec]), SimpleNamespace(last_eval=start))
    quiet.on_validation_end(_trainer(100, [rec]), SimpleNamespace(last_eval=later))
    assert quiet.counts["heldout_below_start"] == 0


def test_truncation_and_looping_fire_on_their_window_means():
    cut = [HEALTHY._replace(truncated=0.2)] * 5 + [HEALTHY._replace(truncated=0.4)] * 5  # mean 0.30 > 0.25
    assert "30.0% of completions were cut" in check(cut, T)["truncation"]
    assert "truncation" not in check([HEALTHY._replace(truncated=0.25)] * 10, T)
    looped = [HEALTHY._replace(looping=0.15)] * 10
    assert "repeat a token 4-gram" in check(looped, T)["looping"]
    assert "looping" not in check([HEALTHY._replace(looping=0.1)] * 10, T)


def test_step_stats_carry_the_truncated_and_looping_shares():
    report = make_report(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
    report = dataclasses.replace(report, truncated=torch.tensor([True, False, False, False]),
                                 looping=torch.tensor([True, True, False, False]))
    s = StepStats(*step_stats(report).tolist())
    assert (s.truncated, s.looping) == (0.25, 0.5)


@pytest.mark.parametrize("ids, loops_", [
    ([1, 2, 3, 4] * 4, True),  # the 4-gram 1 2 3 4 four times
    ([1, 2, 3, 4] * 3 + [1, 2, 3], False),  # three times, and a partial fourth
    ([7] * 7, True),  # 7 7 7 7 starts at four places
    ([7] * 6, False),  # at three
    ([1, 2, 3], False),  # shorter than the n-gram
])
def test_a_row_loops_when_a_4gram_occurs_more_than_three_times(ids, loops_):
    from grpo_aug.algo.masks import loops

    assert loops(ids) is loops_
