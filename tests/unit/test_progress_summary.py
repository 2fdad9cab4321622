import io
import logging
import os

import pytest

import grpo_aug.progress as progress_lib
from grpo_aug.progress import Progress, clock
from grpo_aug.summary import accuracy_table, build_summary, summary_text


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_clock():
    assert [clock(s) for s in (0, 59.4, 61, 3599, 3600, 3725)] == ["0:00", "0:59", "1:01", "59:59", "1:00:00",
                                                                    "1:02:05"]


def test_terminal_line_counts_to_the_total_with_rate_and_eta(monkeypatch):
    t = Clock(100.0)
    monkeypatch.setattr(progress_lib.time, "monotonic", t)
    out = Terminal()
    line = Progress("GRPO", 5, stream=out)
    t.now = 104.0
    line.update(2, bucket="easy", reward="0.50")
    # 2 steps in 4 s: 2 s/step, 3 steps left: 6 s
    assert out.getvalue() == "\r\x1b[2KGRPO  2/5  40%  2.00 s/step  ETA 0:06  bucket easy  reward 0.50"
    t.now = 110.0
    line.update(5, bucket="hard")
    assert out.getvalue().endswith("\r\x1b[2KGRPO  5/5  100%  2.00 s/step  ETA 0:00  bucket hard  reward 0.50")
    line.close()
    assert out.getvalue().endswith("reward 0.50\n")


def test_a_line_wider_than_the_terminal_is_cut(monkeypatch):
    monkeypatch.setattr(progress_lib.shutil, "get_terminal_size", lambda: os.terminal_size((40, 24)))
    monkeypatch.setattr(progress_lib.time, "monotonic", Clock(5.0))  # no time passes: 0 s/step
    out = Terminal()
    Progress("GRPO", 200, stream=out).update(7, bucket="medium", reward="0.61", eval="@0 easy 0.21 medium 0.35")
    assert out.getvalue() == "\r\x1b[2K" + "GRPO  7/200  3%  0.00 s/step  ETA 0:00  bucket medium"[:39]


def test_a_resumed_line_measures_its_own_steps(monkeypatch):
    t = Clock(0.0)
    monkeypatch.setattr(progress_lib.time, "monotonic", t)
    line = Progress("GRPO", 200, start=100, stream=Terminal())
    assert line.text() == "GRPO  100/200  50%"  # no rate before a step ran
    t.now = 30.0
    line.update(110)
    assert line.text() == "GRPO  110/200  55%  3.00 s/step  ETA 4:30"


def test_off_a_terminal_a_log_line_every_period_and_at_the_end(monkeypatch, caplog):
    t = Clock(0.0)
    monkeypatch.setattr(progress_lib.time, "monotonic", t)
    line = Progress("warm-up", 10, stream=io.StringIO(), log_every_s=30)
    with caplog.at_level(logging.INFO, logger="grpo_aug.progress"):
        for step in range(1, 11):
            t.now = 10.0 * step  # 10 s a step: a line at 30 s, 60 s, 90 s and at the last step
            line.update(step)
    assert [r.getMessage().split("  ")[1] for r in caplog.records] == ["3/10", "6/10", "9/10", "10/10"]


def test_a_disabled_line_prints_nothing(caplog):
    out = Terminal()
    line = Progress("GRPO", 3, stream=out, enabled=False)
    with caplog.at_level(logging.INFO):
        line.update(3)
        line.close()
    assert out.getvalue() == "" and not caplog.records


def test_a_log_record_clears_the_line_first():
    out = Terminal()
    line = Progress("GRPO", 3, stream=out)
    line.update(1)
    progress_lib.LineAwareFilter().filter(logging.makeLogRecord({"msg": "hello"}))
    drawn, cleared = out.getvalue().rsplit("\r\x1b[2K", 1)
    assert drawn.startswith("\r\x1b[2KGRPO  1/3  33%") and cleared == ""
    assert Progress.shown is None


def test_progress_needs_a_total():
    with pytest.raises(ValueError, match="total >= 1, got 0"):
        Progress("GRPO", 0)


EVALS = [(0, {"eval/accuracy/easy": 0.2, "eval/accuracy/hard": 0.1}),
         (50, {"eval/accuracy/easy": 0.5, "eval/accuracy/hard": 0.1}),
         (100, {"eval/accuracy/easy": 0.6, "eval/accuracy/hard": 0.2}),
         (150, {"eval/accuracy/easy": 0.7, "eval/accuracy/hard": 0.3}),
         (200, {"eval/accuracy/easy": 0.8, "eval/accuracy/hard": 0.4, "eval/pass@8/easy": 0.9})]


def test_accuracy_table_start_final_gain_by_hand():
    table = accuracy_table(EVALS)
    assert set(table) == {"easy", "hard"}  # accuracy keys only
    # easy: start 0.2, final (0.6 + 0.7 + 0.8) / 3 = 0.7, gain 0.5; hard: 0.1, 0.3, 0.2
    assert table["easy"]["start"] == 0.2 and table["easy"]["final"] == pytest.approx(0.7)
    assert table["easy"]["gain"] == pytest.approx(0.5)
    assert table["hard"]["final"] == pytest.approx(0.3) and table["hard"]["gain"] == pytest.approx(0.2)
    assert table["easy"]["final_steps"] == [100, 150, 200] and table["easy"]["start_step"] == 0
    # fewer than three evaluations: the mean of those there are
    short = accuracy_table(EVALS[:2])
    assert short["easy"]["final"] == pytest.approx(0.35) and short["easy"]["final_steps"] == [0, 50]
    assert accuracy_table([]) == {}


def test_summary_time_split_and_text(tmp_path):
    seconds = {"total": 600.0, "warmup": 300.0, "grpo": 200.0, "evaluation": 40.0}
    s = build_summary(tmp_path, EVALS, seconds, 200, 0.25, {"low_std": 2, "kl_spike": 0}, True, tmp_path / "h.png")
    assert s["seconds"]["other"] == pytest.approx(60.0)
    assert s["alerts"] == {"low_std": 2}
    assert s["tensorboard_command"] == f"tensorboard --logdir {tmp_path / 'tensorboard'}"
    text = summary_text(s)
    assert "10:00 in all: warm-up 5:00, GRPO 3:20, 1.00 s/step, evaluation 0:40, loading and saving 1:00" in text
    assert "easy                     0.200   0.700  +0.500" in text
    assert "25.0% of the rows" in text and "low_std x2" in text
    assert "of which" not in text  # no phases timed, none printed
    quiet = summary_text(build_summary(tmp_path, EVALS, seconds, 200, None, {}, False, None))
    assert "alerts: none fired" in quiet and "tensorboard" not in quiet and "flat rows" not in quiet
    # 200 steps: rollout 120 s -> 0.6 a step, reference 20 -> 0.1, update 60 -> 0.3
    timed = build_summary(tmp_path, EVALS, seconds, 200, None, {}, False, None,
                          {"update": 60.0, "rollout": 120.0, "reference": 20.0})
    assert timed["phase_seconds"] == {"update": 60.0, "rollout": 120.0, "reference": 20.0}
    assert "GRPO 3:20, 1.00 s/step (of which rollout 0.6, reference 0.1, update 0.3 s/step), evaluation" in \
        summary_text(timed)


def test_step_clock_charges_each_phase_the_time_since_the_last_mark():
    from grpo_aug.step_clock import StepClock

    times = iter([10.0, 11.5, 14.0, 14.25, 20.0, 21.0])
    syncs = []
    clock = StepClock(sync=lambda: syncs.append(1), clock=lambda: next(times))
    clock.start()  # 10.0
    clock.lap("rollout")  # 11.5
    clock.lap("reference")  # 14.0
    clock.lap("update")  # 14.25
    assert clock.take() == {"rollout": 1.5, "reference": 2.5, "update": 0.25}
    assert len(syncs) == 4  # the device waited for at every mark, before the time was read
    clock.start()  # 20.0: the next step starts from nothing
    clock.lap("rollout")  # 21.0
    assert clock.take() == {"rollout": 1.0}
    with pytest.raises(RuntimeError, match="before start"):
        clock.lap("update")


def test_run_record_totals_the_steps_phases_across_a_resume():
    from grpo_aug.callbacks.run_record import RunRecord

    record = RunRecord()
    for rollout, update in ((2.0, 1.0), (3.0, 0.5)):
        record.on_train_batch_end(None, None, {"seconds": {"rollout": rollout, "update": update}}, None, 0)
    record.on_train_batch_end(None, None, None, None, 0)  # a step that returned nothing adds nothing
    assert record.phase_seconds == {"rollout": 5.0, "update": 1.5}
    resumed = RunRecord()
    resumed.load_state_dict(record.state_dict())
    resumed.on_train_batch_end(None, None, {"seconds": {"rollout": 1.0}}, None, 0)
    assert resumed.phase_seconds == {"rollout": 6.0, "update": 1.5}
    older = record.state_dict()
    del older["phase_seconds"]  # a checkpoint written before the phases were timed
    again = RunRecord()
    again.load_state_dict(older)
    assert again.phase_seconds == {}


def test_run_record_resumes_with_the_earlier_processes_seconds_and_evaluations():
    from grpo_aug.callbacks.run_record import RunRecord

    first = RunRecord()
    first.add_warmup(300.0)  # built the warm-up
    first.evaluations = [(0, {"eval/accuracy/easy": 0.2}), (50, {"eval/accuracy/easy": 0.5})]
    first.eval_seconds, first.train_seconds = 12.0, 100.0
    state = first.state_dict()
    resumed = RunRecord()
    resumed.add_warmup(0.5)  # found it in the cache, before the checkpoint is read
    resumed.load_state_dict(state)
    assert resumed.warmup_seconds == 300.5 and resumed.eval_seconds == 12.0 and resumed.train_seconds == 100.0
    assert resumed.evaluations == first.evaluations


def test_first_process_reads_the_launchers_variables(monkeypatch):
    from grpo_aug.distributed import first_process

    for name in ("RANK", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert first_process()  # a single process
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("NODE_RANK", "1")  # Lightning's launcher, node 1: local rank 0 is not the first
    assert not first_process()
    monkeypatch.setenv("NODE_RANK", "0")
    assert first_process()
    monkeypatch.setenv("RANK", "3")  # torchrun
    assert not first_process()


def test_the_progress_line_names_the_step_s_bucket_or_its_mix():
    from grpo_aug.callbacks.progress import bucket_label

    assert bucket_label(("medium",) * 4) == "medium"
    assert bucket_label(("hard", "easy", "easy", "hard", "easy")) == "easy 3 hard 2"  # in bucket order
