"""Reading a run's TensorBoard event files back (the plotting script and the tests use it)."""

from __future__ import annotations

from pathlib import Path


def read_events(run_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar in `run_dir/tensorboard`'s event files as (step, wall time, value) per tag, read
    with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, list[tuple[int, float, float]]] = {}
    for f in sorted((Path(run_dir) / "tensorboard").glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.step, e.wall_time, e.value) for e in acc.Scalars(tag))
    return scalars


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar as (step, value) pairs per tag."""
    return {tag: [(step, value) for step, _, value in events] for tag, events in read_events(run_dir).items()}
