"""Sample tables for the experiment trackers that have tables (`logger=wandb|mlflow`); TensorBoard
gets the same rows as markdown text (callbacks/health.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

COLUMNS = ("prompt", "completion", "temperature", "reward", "advantage")


def transcript(segments: list[tuple[str, str]]) -> str:
    """A multi-turn completion with each segment's role: `[policy] ... [tool] ...`."""
    return " ".join(f"[{role}] {text}" for role, text in segments)


def cell(row: dict, column: str):
    return transcript(row["segments"]) if column == "completion" and "segments" in row else row[column]


def write_sample_tables(loggers: Sequence, samples: Mapping[str, list[dict]], step: int) -> None:
    """One table per bucket: a W&B table under samples/<bucket>, or an MLflow table artifact
    samples/<bucket>/step_<step>.json in the run."""
    from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

    for logger in loggers:
        for bucket, rows in sorted(samples.items()):
            data = [[cell(r, c) for c in COLUMNS] for r in rows]
            if isinstance(logger, WandbLogger):
                logger.log_table(key=f"samples/{bucket}", columns=list(COLUMNS), data=data, step=step)
            elif isinstance(logger, MLFlowLogger):
                logger.experiment.log_table(logger.run_id, data={c: [cell(r, c) for r in rows] for c in COLUMNS},
                                            artifact_file=f"samples/{bucket}/step_{step:07d}.json")
