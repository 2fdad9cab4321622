"""The reward child (rewards/worker.py) ends when its parent wants it to, whatever handlers the
parent had when it forked: a trainer's log-only SIGTERM handler (Lightning's, inside fit) made the
parent's exit wait forever, and a child holding its own copy of the parent's end of the pipe
outlived a parent that died. A terminal's Ctrl-C leaves it serving."""

import os
import signal

import pytest

from grpo_aug.rewards.worker import TimedCalls

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the child is forked where fork exists")


def _double(x):
    return 2 * x


@pytest.fixture
def log_only_sigterm():
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # as Lightning's, inside fit
    yield
    signal.signal(signal.SIGTERM, previous)


def _started() -> TimedCalls:
    calls = TimedCalls([_double], timeout_s=30)
    assert calls.call(0, 21) == ("ok", 42)
    return calls


def test_sigterm_ends_the_child_though_the_parent_only_logs_it(log_only_sigterm):
    calls = _started()
    calls.process.terminate()  # what multiprocessing's exit does to a daemon child
    calls.process.join(timeout=10)
    assert not calls.process.is_alive()


def test_the_child_ends_when_the_parent_end_of_the_pipe_closes():
    calls = _started()
    calls.conn.close()  # as when the parent dies: the child's recv must see the end of the pipe
    calls.process.join(timeout=10)
    assert not calls.process.is_alive()


def test_ctrl_c_leaves_the_child_serving():
    calls = _started()
    os.kill(calls.process.pid, signal.SIGINT)
    assert calls.call(0, 5) == ("ok", 10)
    assert calls.process.is_alive()
    calls.close()
