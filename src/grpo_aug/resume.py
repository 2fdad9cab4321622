"""What an exact resume needs beyond weights and optimizer: every random stream, per rank, and
the run directory's latest checkpoint.

Lightning saves a checkpoint from rank 0 only, but each rank has its own streams (and its own
unsynced metric windows). So each rank's state is gathered into the checkpoint as a list
indexed by rank (`distributed.gather_per_rank`, called on every rank: Lightning builds the checkpoint dict
on all of them) and each rank takes its own entry back (`own_entry`).
"""

from __future__ import annotations

import logging
import random
import zipfile
from pathlib import Path

import torch

from grpo_aug.distributed import rank_world
from grpo_aug.errors import UsageError

log = logging.getLogger(__name__)


def own_entry(states: list, what: str):
    """This rank's entry of a gather_per_rank list; None (with a warning) if the world size changed."""
    rank, world = rank_world()
    if len(states) != world:
        log.warning("the checkpoint's %s come from %d rank(s), this run has %d: they start afresh, so the run "
                    "continues correctly but not bit for bit", what, len(states), world)
        return None
    return states[rank]


def capture_rng(generator: torch.Generator | None) -> dict:
    """Every random stream a training step may draw from on this rank."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        name, keys, pos, has_gauss, gauss = np.random.get_state()
        # plain types: Lightning loads checkpoints with weights_only=True, which refuses numpy arrays
        state["numpy"] = (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))
    except ImportError:
        pass
    if generator is not None:
        state["rollout"] = generator.get_state()
    return state


def restore_rng(state: dict, generator: torch.Generator | None) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if generator is not None and "rollout" in state:
        generator.set_state(state["rollout"])


def read_checkpoint(path: str | Path, key: str = "ckpt_path") -> dict:
    """A training checkpoint's contents, memory-mapped (the weights are read when touched).

    Loaded with weights_only=True: unpickling may run code, and a grpo-aug checkpoint holds only
    tensors, numbers, strings and containers. A file cut short (a run killed while saving) or not a
    checkpoint at all stops with a ValueError that names `key`, the file and what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{key}={str(path)!r}: no such file")
    try:
        with zipfile.ZipFile(path) as archive:  # torch.save writes a zip; its index sits at the end
            archive.namelist()
    except zipfile.BadZipFile as err:
        raise UsageError(f"{key}={str(path)!r}: the checkpoint is cut short or not a checkpoint "
                         f"({path.stat().st_size} bytes, no zip index at its end: a run killed while saving "
                         f"leaves such a file); use an earlier checkpoint") from err
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:
        raise UsageError(f"{key}={str(path)!r}: cannot read the checkpoint ({err})") from err


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The checkpoint with the highest global step in `directory` (None if there is none).

    Files are opened memory-mapped: only the small header entries are read, not the weights."""
    best, best_step = None, -1
    for path in sorted(Path(directory).glob("*.ckpt")):
        try:
            step = int(read_checkpoint(path)["global_step"])
        except Exception as err:  # a file cut short by the kill: skip it, say so
            log.warning("resume: %s is not a readable checkpoint (%s); ignored", path, err)
            continue
        if step > best_step:
            best, best_step = path, step
    return best
