"""Data rows and their errors: one bad row of a file is named by `file:line` (or `file[row i]`)
and stops setup, or with data.on_bad_row=skip is left out, counted and summarised in the log."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from grpo_aug.data.records import Prompt
from grpo_aug.errors import UsageError

log = logging.getLogger(__name__)

ON_BAD_ROW = ("raise", "skip")


class BadRow(UsageError):
    """One unusable row of a data file; the message starts with where it is."""


def keep_good_rows(items: Iterable[tuple[str, object]], make: Callable[[object, str], Prompt], on_bad_row: str,
                   source: str) -> list[Prompt]:
    """`make(raw, where)` for every (where, raw) item; a BadRow it raises, or a repeated id, stops
    here (on_bad_row='raise') or is left out and summarised (on_bad_row='skip')."""
    if on_bad_row not in ON_BAD_ROW:
        raise UsageError(f"data.on_bad_row must be one of {ON_BAD_ROW}, got {on_bad_row!r}")
    records, bad, seen = [], [], {}
    for where, raw in items:
        try:
            record = make(raw, where)
            if record.id in seen:
                raise BadRow(f"{where}: duplicate id {record.id!r} (first used at {seen[record.id]})")
        except BadRow as err:
            if on_bad_row == "raise":
                raise
            bad.append(str(err))
            continue
        seen[record.id] = where
        records.append(record)
    if bad:
        shown = "\n  ".join(bad[:5]) + (f"\n  ... and {len(bad) - 5} more" if len(bad) > 5 else "")
        log.warning("data.on_bad_row=skip: left out %d bad row(s) of %s (%d kept):\n  %s", len(bad), source,
                    len(records), shown)
    if not records:
        raise UsageError(f"{source}: no usable records" + (f" ({len(bad)} bad rows skipped)" if bad else ""))
    return records
