"""Errors the project raises on purpose: a bad config value, data row, checkpoint, tool, engine or
server, a run stopped by its own guard. Their message names the value and where it came from;
`python train.py` prints it as one line and exits 1, without a traceback (train.py). Anything else
that escapes is unexpected and keeps its traceback.

UsageError is a ValueError, so code and tests that catch ValueError keep working."""

from __future__ import annotations


class UsageError(ValueError):
    pass


def usage_message(err: BaseException) -> str | None:
    """The one line to show for `err` if it is raised on purpose (through any wrappers that only
    carry it, such as Hydra's InstantiationException), else None."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, UsageError):
            return " ".join(str(err).split())
        if type(err).__name__ != "InstantiationException":
            return None
        err = err.__cause__
    return None


class MissingFile(UsageError, FileNotFoundError):
    """A file a setting names is not there."""


class MissingPackage(UsageError, ImportError):
    """An option needs a package that is not installed."""


class ServerError(UsageError, RuntimeError):
    """A vLLM server cannot serve the run; the message names its URL and what to do."""
