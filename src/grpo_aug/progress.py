"""One progress line for a loop that counts to a known total: the warm-up's SFT steps and GRPO's
optimizer steps.

On a terminal the line is redrawn in place (`warm-up  412/1000  41%  0.29 s/step  ETA 2:51  loss
0.0412`); when the output is not a terminal (CI, `nohup`, a pipe) the same text goes out as a plain
log line every `log_every_s` seconds and at the last step, so a log file grows evenly and ends with
the total. Log records written while a line is shown clear it first (`LineAwareFilter`), so the two
never share a row.
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from typing import TextIO

from grpo_aug.errors import UsageError

log = logging.getLogger(__name__)


def clock(seconds: float) -> str:
    """h:mm:ss or m:ss."""
    seconds = max(int(round(seconds)), 0)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """`label  done/total  pct  s/step  ETA  fields`; ETA = mean seconds per step since start x steps left.

    start: the count the loop begins at (a resumed run), so the rate is measured on the steps this
    process ran. enabled=False prints nothing (every rank but 0)."""

    shown: Progress | None = None  # the line currently on the terminal, cleared before a log record

    def __init__(self, label: str, total: int, start: int = 0, stream: TextIO | None = None,
                 log_every_s: float = 30.0, enabled: bool = True) -> None:
        if total < 1:
            raise UsageError(f"a progress line needs a total >= 1, got {total}")
        self.label, self.total, self.start = label, total, start
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self.log_every_s, self.enabled = log_every_s, enabled
        self.began = time.monotonic()
        self.last_logged = self.began
        self.done = start
        self.fields: dict[str, str] = {}
        if self.terminal and enabled:
            attach_to_console()

    def seconds_per_step(self) -> float | None:
        ran = self.done - self.start
        return (time.monotonic() - self.began) / ran if ran > 0 else None

    def text(self) -> str:
        parts = [self.label, f"{self.done}/{self.total}", f"{100 * self.done // self.total}%"]
        rate = self.seconds_per_step()
        if rate is not None:
            parts += [f"{rate:.2f} s/step", f"ETA {clock(rate * (self.total - self.done))}"]
        parts += [f"{k} {v}" for k, v in self.fields.items()]
        return "  ".join(parts)

    def update(self, done: int, **fields: str) -> None:
        """`done` steps of `total`; fields (already formatted) replace the previous ones of that name."""
        self.done = min(done, self.total)
        self.fields.update(fields)
        if not self.enabled:
            return
        if self.terminal:
            self.draw()
            return
        now = time.monotonic()
        if self.done >= self.total or now - self.last_logged >= self.log_every_s:
            self.last_logged = now
            log.info(self.text())

    def draw(self) -> None:
        # a line longer than the terminal wraps, and the next redraw would clear only its last row
        width = shutil.get_terminal_size().columns
        self.stream.write("\r\x1b[2K" + self.text()[: max(width - 1, 20)])
        self.stream.flush()
        Progress.shown = self

    def clear(self) -> None:
        """Wipe the line (a log record is about to be written); the next update redraws it."""
        if Progress.shown is self:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            Progress.shown = None

    def close(self) -> None:
        """Leave the final line on the terminal (plain mode: it was logged at the last step)."""
        if self.enabled and self.terminal:
            self.draw()
            self.stream.write("\n")
            self.stream.flush()
            Progress.shown = None


class LineAwareFilter(logging.Filter):
    """On the console's handlers: a record clears the progress line before it is written."""

    def filter(self, record: logging.LogRecord) -> bool:
        if Progress.shown is not None:
            Progress.shown.clear()
        return True


def attach_to_console() -> None:
    """Put the filter on the root logger's stream handlers (Hydra's console handler among them)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            if not any(isinstance(f, LineAwareFilter) for f in handler.filters):
                handler.addFilter(LineAwareFilter())
