"""A rank that dies or freezes: the survivors stop within a bounded time and say what happened.

Every collective waits for all ranks. When one rank is killed, its peers' gloo sockets reset
within seconds; when one freezes (SIGSTOP, a debugger, a hung call), or on NCCL where a dead
peer looks like a silent one, they wait for the collective timeout (`trainer.strategy.timeout`).
Either way the collective raises on each survivor, and this module turns that raw backend error
into one message: which rank stopped responding and how (died, frozen, silent), at which step,
which checkpoint is intact, and that `resume=auto` continues from it.

`RankWatch` (a callback) does both halves. Each rank leaves a heartbeat file
(`<run>/ranks/rank-<r>.json`: pid, host, step, time) at every step. A survivor reads its peers'
files: a peer that raised an error of its own left it in its file (named first); on its own host
it tells a dead process (gone, or a zombie) from a frozen one (state T) from one that is alive but
silent; a peer on another node is named by its last heartbeat where
the run directory is shared, or not at all.

On one node Lightning's launcher (rank 0) also watches its child ranks and SIGKILLs everything
when one exits; it logs that first, and the same message is written then (`LauncherWatch`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

import lightning as L
import torch.distributed as dist

from grpo_aug.distributed import rank_world
from grpo_aug.resume import latest_checkpoint

log = logging.getLogger(__name__)

EXIT_RANK_FAILURE = 3  # the process exit status after a rank stopped responding
# a RuntimeError from the collective backends names them (gloo's carry their source path); a
# reward's or an engine's own error does not, and is raised as itself
SIGNS = ("gloo", "nccl", "c10d", "processgroup", "connection reset by peer")
_reported = threading.Event()  # one message per process, whichever side notices first


def is_collective_failure(err: BaseException, world: int | None = None) -> bool:
    """Did a collective fail because a peer went away or never answered? (world: the number of
    ranks, torch.distributed's by default)"""
    if (rank_world()[1] if world is None else world) == 1:
        return False
    if isinstance(err, dist.DistError):
        return True
    return isinstance(err, RuntimeError) and any(s in str(err).lower() for s in SIGNS)


def process_state(pid: int) -> str:
    """'dead', 'frozen' (stopped: SIGSTOP, a debugger) or 'alive', for a process on this host."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return "dead"
    except OSError:  # no /proc: ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "dead"
        return "alive"
    state = fields[0]
    return {"Z": "dead", "X": "dead", "T": "frozen", "t": "frozen"}.get(state, "alive")


def read_beats(directory: Path, me: int) -> list[dict]:
    beats = []
    for f in sorted(directory.glob("rank-*.json")):
        try:
            beat = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if beat.get("rank") != me:
            beats.append(beat)
    return beats


def diagnose(directory: Path, me: int, now: float | None = None) -> tuple[list[int], str]:
    """(the ranks that stopped, a sentence on each) from the peers' heartbeats."""
    now = time.time() if now is None else now
    host = socket.gethostname()
    beats = read_beats(directory, me)
    if not beats:
        return [], "no peer heartbeat is visible from this node (the other ranks run elsewhere)"
    found, words = [], []
    for b in beats:
        if b.get("error"):  # it raised an error of its own (an engine, a reward): the cause, not a symptom
            found.append(b["rank"])
            words.append(f"rank {b['rank']} (pid {b['pid']}) failed at step {b['step']} with {b['error']}")
            continue
        state = process_state(b["pid"]) if b.get("host") == host else "remote"
        if state in ("dead", "frozen"):
            found.append(b["rank"])
            how = "died" if state == "dead" else "is frozen (stopped: SIGSTOP, a debugger)"
            words.append(f"rank {b['rank']} (pid {b['pid']}) {how}, last seen at step {b['step']}")
    if not found:  # every visible peer is alive: the silent one is the one furthest behind
        oldest = min(beats, key=lambda b: (b["step"], b["time"]))
        found.append(oldest["rank"])
        where = "" if oldest.get("host") == host else f" on {oldest.get('host')}"
        words.append(f"rank {oldest['rank']} (pid {oldest['pid']}{where}) stopped responding: its last heartbeat "
                     f"was step {oldest['step']}, {now - oldest['time']:.0f} s ago")
    return found, "; ".join(words)


def failure_message(run_dir: Path, me: int, step: int, cause: str) -> tuple[list[int], str]:
    ranks, what = diagnose(run_dir / "ranks", me)
    latest = latest_checkpoint(run_dir / "checkpoints")
    if latest is None:
        resume = "no checkpoint was written yet: the run starts afresh with resume=auto"
    else:
        resume = f"the last checkpoint is {latest}; rerun the same command with resume=auto to continue from it"
    return ranks, (f"rank {me}: a collective failed at step {step} ({cause}): {what}. This rank stops (exit "
                   f"{EXIT_RANK_FAILURE}); {resume} (hydra.run.dir={run_dir})")


def report(run_dir: Path, me: int, step: int, cause: str) -> None:
    """Write the message once (stderr and the log), then end this host's other ranks that still
    hold the run (a frozen one would otherwise stay forever)."""
    if _reported.is_set():
        return
    _reported.set()
    _, message = failure_message(run_dir, me, step, cause)
    log.error(message)
    print(message, file=sys.stderr, flush=True)
    host = socket.gethostname()
    for b in read_beats(run_dir / "ranks", me):
        if b.get("host") == host and process_state(b["pid"]) == "frozen":
            try:
                os.kill(b["pid"], 9)
            except ProcessLookupError:
                pass


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300] if text else ''}"


class LauncherWatch(logging.Handler):
    """Lightning's launcher logs that a child rank exited, then SIGKILLs every rank at once: the
    message is written as it logs (rank 0 only, where the launcher runs)."""

    def __init__(self, run_dir: Path, trainer: L.Trainer) -> None:
        super().__init__(logging.INFO)
        self.run_dir, self.trainer = run_dir, trainer

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "Child process with PID" in text:
            report(self.run_dir, self.trainer.global_rank, self.trainer.global_step, text.split(". Forcefully")[0])


LAUNCHER_LOGGER = logging.getLogger("lightning.fabric.strategies.launchers.subprocess_script")


class RankWatch(L.Callback):
    """Under several ranks: a heartbeat file per rank at every step, and a collective that fails
    because a peer went away ends this rank at once with the named message and
    EXIT_RANK_FAILURE. It exits before Lightning's teardown, whose own collectives could wait on
    the missing rank again."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = Path(run_dir)
        self.launcher_watch: LauncherWatch | None = None

    def beat(self, trainer: L.Trainer, error: str | None = None) -> None:
        if trainer.world_size == 1:
            return
        directory = self.run_dir / "ranks"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"rank-{trainer.global_rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rank": trainer.global_rank, "pid": os.getpid(), "host": socket.gethostname(),
                                   "step": trainer.global_step, "time": time.time(), "error": error}))
        tmp.replace(path)  # whole files only: a reader never sees half a beat

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.beat(trainer)
        if trainer.world_size > 1 and trainer.global_rank == 0 and self.launcher_watch is None:
            self.launcher_watch = LauncherWatch(self.run_dir, trainer)
            LAUNCHER_LOGGER.addHandler(self.launcher_watch)
            if LAUNCHER_LOGGER.getEffectiveLevel() > logging.INFO:
                LAUNCHER_LOGGER.setLevel(logging.INFO)  # its child-exit record must reach the handler

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self.launcher_watch is not None:
            LAUNCHER_LOGGER.removeHandler(self.launcher_watch)
            self.launcher_watch = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.beat(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if is_collective_failure(exception):
            report(self.run_dir, trainer.global_rank, trainer.global_step, first_line(exception))
            logging.shutdown()
            os._exit(EXIT_RANK_FAILURE)
        # this rank's own error: the peers, whose next collective fails, name it. Written before
        # Lightning's teardown closes the process group, so before any peer can notice
        self.beat(trainer, error=first_line(exception))
