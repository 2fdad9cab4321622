"""A rank that dies or freezes: the survivors stop within a bounded time, naming the rank, the
step and the checkpoint that resume=auto continues from; and a run whose ranks' data differ
(one rank never has an informative group) finishes instead of hanging."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from grpo_aug.callbacks.rank_watch import diagnose, failure_message, is_collective_failure, process_state
from helpers import ACCELERATOR, TINY, kill_one_rank_resume_and_compare, read_scalars, run_train


def _beat(directory, rank, pid, step, age=0.0, host=None):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"rank-{rank}.json").write_text(json.dumps(
        {"rank": rank, "pid": pid, "host": host or socket.gethostname(), "step": step, "time": time.time() - age}))


def test_process_state_tells_dead_frozen_and_alive_apart():
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()  # reaped: the pid is gone
    frozen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.kill(frozen.pid, signal.SIGSTOP)
        time.sleep(0.5)  # the zombie has exited, not yet reaped
        assert process_state(done.pid) == "dead"
        assert process_state(zombie.pid) == "dead"
        assert process_state(frozen.pid) == "frozen"
        assert process_state(os.getpid()) == "alive"
    finally:
        frozen.kill()
        frozen.wait()
        zombie.wait()


def test_diagnose_names_the_dead_or_frozen_rank_else_the_one_furthest_behind(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    d = tmp_path / "ranks"
    _beat(d, 0, os.getpid(), 7)
    _beat(d, 1, gone.pid, 6)
    _beat(d, 2, os.getpid(), 7)
    ranks, words = diagnose(d, me=0)
    assert ranks == [1] and f"rank 1 (pid {gone.pid}) died, last seen at step 6" in words

    d2 = tmp_path / "silent"
    _beat(d2, 0, os.getpid(), 9)
    _beat(d2, 1, os.getpid(), 8, age=40, host="node-b")  # another node: alive or not cannot be read here
    _beat(d2, 2, os.getpid(), 9, age=1)
    ranks, words = diagnose(d2, me=0)
    assert ranks == [1]
    assert re.search(r"rank 1 \(pid \d+ on node-b\) stopped responding: its last heartbeat was step 8, 4\d s ago",
                     words)

    assert diagnose(tmp_path / "none", me=0)[0] == []


def test_the_message_says_step_checkpoint_and_resume(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _beat(tmp_path / "ranks", 1, gone.pid, 4)
    (tmp_path / "checkpoints").mkdir()
    for step in (2, 4):
        torch.save({"global_step": step, "state_dict": {}}, tmp_path / "checkpoints" / f"step-{step}.ckpt")
    ranks, message = failure_message(tmp_path, me=0, step=4, cause="RuntimeError: Connection reset by peer")
    assert ranks == [1]
    assert message.startswith("rank 0: a collective failed at step 4 (RuntimeError: Connection reset by peer)")
    assert "rank 1" in message and "died" in message
    assert f"the last checkpoint is {tmp_path / 'checkpoints' / 'step-4.ckpt'}" in message
    assert "resume=auto" in message and "exit 3" in message


def test_only_the_backends_errors_count_as_a_peer_gone():
    import torch.distributed as dist

    reset = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:22933: "
                         "Connection reset by peer")
    assert is_collective_failure(reset, world=2)
    assert is_collective_failure(dist.DistBackendError("Watchdog caught collective operation timeout"), world=2)
    assert not is_collective_failure(reset, world=1)  # one process has no peer to lose
    assert not is_collective_failure(RuntimeError("the reward server timed out"), world=2)
    assert not is_collective_failure(ValueError("gloo"), world=2)


RUN = ["debug=fast", *TINY, "reward=similarity", "trainer.max_steps=8", "trainer.val_check_interval=4",
       "callbacks.checkpoint.every_n_train_steps=2", "trainer.strategy.timeout.seconds=20"]
STRATEGIES = {"ddp": ["trainer=ddp", f"trainer.accelerator={ACCELERATOR}", "trainer.devices=2"],
              "fsdp2": ["trainer=fsdp", f"trainer.accelerator={ACCELERATOR}", "trainer.devices=2",
                        "trainer.precision=32-true"]}
# (rank, signal, the survivor's words for it)
FAILURES = {"kill-rank1": (1, signal.SIGKILL, "rank 1 (pid {pid}) died"),
            "kill-rank0": (0, signal.SIGKILL, "rank 0 (pid {pid}) died"),
            "stop-rank1": (1, signal.SIGSTOP, "rank 1 (pid {pid}) is frozen")}
BOUND_S = 120  # from the kill to the last process gone: gloo's reset, or the 20 s collective timeout, and exit


@pytest.mark.slow
@pytest.mark.parametrize("failure", list(FAILURES))
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_rank_that_dies_or_freezes_stops_the_run_within_a_bound_with_a_named_message(strategy, failure, tmp_path):
    rank, sig, words = FAILURES[failure]
    kill = ["+callbacks.kill._target_=helpers.KillRankAt", "+callbacks.kill.step=5", f"+callbacks.kill.rank={rank}",
            f"+callbacks.kill.signal={int(sig)}"]
    start = time.time()
    out = run_train(tmp_path, [*RUN, *STRATEGIES[strategy], *kill], timeout=600)
    elapsed = time.time() - start
    text = out.stdout + out.stderr
    beats = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in (tmp_path / "run" / "ranks").glob("*.json")}
    stopped = beats[rank]
    assert stopped["step"] == 5
    assert process_state(stopped["pid"]) == "dead"  # the frozen rank too: the survivor ended it
    survivor = 1 - rank
    message = next((line for line in text.splitlines() if line.startswith(f"rank {survivor}: a collective failed")),
                   None)
    assert message is not None, text[-3000:]
    assert words.format(pid=stopped["pid"]) in message
    assert re.search(r"at step [56] ", message)
    assert "resume=auto" in message
    ckpt = re.search(r"the last checkpoint is (\S+\.ckpt);", message).group(1)
    assert torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"] == 4  # the last one written
    assert elapsed < 60 + BOUND_S, elapsed  # ~20-40 s to the kill, then the bound


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_fsdp2_and_ddp_with_a_rank_that_never_has_an_informative_group_finish(strategy, tmp_path):
    """The default binary-reward case that hung under FSDP2: one prompt per rank, zero-std filter
    on, and rank 1's groups always flat (helpers.FlatOnRank1)."""
    flat = ["debug=fast", *TINY, "data.batch_size=1", "trainer.max_steps=6", "trainer.strategy.timeout.seconds=30",
            "reward.functions=[{_target_:grpo_aug.rewards.RewardFunction,fn:{_target_:helpers.FlatOnRank1}}]"]
    out = run_train(tmp_path, [*flat, *STRATEGIES[strategy]], timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    scalars = read_scalars(tmp_path / "run")
    assert [s for s, _ in scalars["eval/accuracy/easy"]][-1] == 6
    assert any(v < 1.0 for _, v in scalars["health/zero_std_frac"])  # rank 0 had groups to train on


@pytest.mark.slow
def test_one_rank_sigkilled_resumes_equal_to_the_uninterrupted_run(tmp_path):
    over = ["debug=fast", *TINY, "reward=similarity", "trainer.max_steps=8",
            "callbacks.checkpoint.every_n_train_steps=4", *STRATEGIES["ddp"], "trainer.strategy.timeout.seconds=30"]
    _, compared = kill_one_rank_resume_and_compare(tmp_path, over, kill_at=4, rank=1)
    assert compared >= 8
