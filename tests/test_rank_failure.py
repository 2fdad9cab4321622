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


def _beat(directory, rank, pid, step, age=0.0, host=None, error=None):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"rank-{rank}.json").write_text(json.dumps(
        {"rank": rank, "pid": pid, "host": host or socket.gethostname(), "step": step, "time": time.time() - age,
         "error": error}))


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

    d3 = tmp_path / "raised"  # alive still (tearing down), but it left its own error: that is named
    _beat(d3, 0, os.getpid(), 5)
    _beat(d3, 1, os.getpid(), 5, error="EngineCrash: the engine crashed")
    assert diagnose(d3, me=0) == ([1], f"rank 1 (pid {os.getpid()}) failed at step 5 with EngineCrash: the engine "
                                       "crashed")

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
    # the frozen rank too: the survivor ended it (a SIGKILLed process may take a moment to exit on a
    # loaded machine while the kernel frees its memory: up to 10 s)
    for _ in range(100):
        if process_state(stopped["pid"]) == "dead":
            break
        time.sleep(0.1)
    assert process_state(stopped["pid"]) == "dead"
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
    # one group per rank per step, rank 1's always flat: the two ranks' share is 0.5 (rank 0's
    # informative) or 1.0 at every step, never 0; and rank 1's four rows add nothing to the reward
    flat = scalars["health/zero_std_frac"]
    assert [s for s, _ in flat] == [1, 2, 3, 4, 5, 6] and {v for _, v in flat} <= {0.5, 1.0}
    assert any(v == 0.5 for _, v in flat)  # rank 0 had groups to train on
    assert all(v <= 0.5 for _, v in scalars["health/reward_mean"])


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_an_engine_that_raises_on_one_rank_mid_generation_stops_both_and_resume_continues(strategy, tmp_path):
    """Rank 1's engine raises inside its decode loop at step 5 while rank 0 decodes on (under
    FSDP2 rank 0's forwards wait on rank 1's all-gathers): both processes end within the bound,
    rank 0 names rank 1 and the step, and resume=auto with a working engine finishes the run."""
    crash = ["rollout.engine._target_=tool_fixtures.RaisesMidGeneration", "+rollout.engine.rank=1",
             "+rollout.engine.step=5", "+rollout.engine.after=3"]
    start = time.time()
    out = run_train(tmp_path, [*RUN, *STRATEGIES[strategy], *crash], timeout=600)
    elapsed = time.time() - start
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "the engine crashed at its decode forward 3" in text, text[-3000:]
    beats = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in (tmp_path / "run" / "ranks").glob("*.json")}
    assert beats[1]["step"] == 5 and all(process_state(b["pid"]) == "dead" for b in beats.values())
    message = next((line for line in text.splitlines() if line.startswith("rank 0: a collective failed")), None)
    assert message is not None, text[-3000:]
    assert (f"rank 1 (pid {beats[1]['pid']}) failed at step 5 with EngineCrash: the engine crashed at its decode "
            "forward 3" in message and "resume=auto" in message)
    assert elapsed < 60 + BOUND_S, elapsed
    resumed = run_train(tmp_path, [*RUN, *STRATEGIES[strategy], "resume=auto"], timeout=600)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert "resume=auto: continuing from" in resumed.stdout + resumed.stderr
    assert [s for s, _ in read_scalars(tmp_path / "run")["eval/accuracy/easy"]][-1] == 8


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_non_finite_loss_on_one_rank_skips_the_update_on_both(strategy, tmp_path):
    """Rank 1's loss is NaN in the update of step 3, rank 0's is finite: neither rank's weights
    move in that update (bit for bit), both move in every other, the two DDP replicas stay equal,
    and the skip is counted once."""
    poison = ["+callbacks.poison._target_=helpers.NonFiniteOnRank", "+callbacks.poison.step=3",
              "+callbacks.poison.rank=1", f"+callbacks.poison.dir={tmp_path / 'weights'}"]
    out = run_train(tmp_path, ["debug=fast", *TINY, "reward=similarity", "trainer.max_steps=6",
                               "trainer.strategy.timeout.seconds=30", *STRATEGIES[strategy], *poison], timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    hashes = [json.loads((tmp_path / "weights" / f"weights-{r}.json").read_text()) for r in (0, 1)]
    for mine in hashes:
        assert len(mine) == 6
        assert mine[3] == mine[2]  # after update 4 (step 3) as after update 3
        assert all(mine[i] != mine[i - 1] for i in (1, 2, 4, 5))
    if strategy == "ddp":
        assert hashes[0] == hashes[1]
    skipped = read_scalars(tmp_path / "run")["train/skipped_nonfinite"]
    assert [v for _, v in skipped] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert "non-finite loss" in out.stdout + out.stderr


@pytest.mark.slow
def test_one_rank_sigkilled_resumes_equal_to_the_uninterrupted_run(tmp_path):
    over = ["debug=fast", *TINY, "reward=similarity", "trainer.max_steps=8",
            "callbacks.checkpoint.every_n_train_steps=4", *STRATEGIES["ddp"], "trainer.strategy.timeout.seconds=30"]
    _, compared = kill_one_rank_resume_and_compare(tmp_path, over, kill_at=4, rank=1)
    assert compared >= 8
