"""Junk characters in completions: what a broken tokenizer, decoding or chat template produces.

A completion character is junk if it is U+FFFD (bytes that did not decode), a control or format
character other than newline, tab and carriage return, or a letter of a script the prompt does not
use (Latin prompt, Cyrillic or CJK letters in the answer). Digits, punctuation and spaces are never
junk. A prompt without letters gives no script to compare with: its completions' letters are not
judged.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Sequence

_ALLOWED_CONTROLS = frozenset("\n\t\r")


@functools.lru_cache(maxsize=4096)
def script(ch: str) -> str | None:
    """The script of a letter, from its Unicode name (LATIN, CYRILLIC, CJK, ...); None for non-letters."""
    if not ch.isalpha():
        return None
    name = unicodedata.name(ch, "")
    return name.split(" ", 1)[0] if name else "UNKNOWN"


def _is_junk(ch: str, scripts: frozenset[str]) -> bool:
    if ch == "\ufffd":
        return True
    if unicodedata.category(ch) in ("Cc", "Cf") and ch not in _ALLOWED_CONTROLS:
        return True
    s = script(ch)
    return bool(scripts) and s is not None and s not in scripts


def junk_count(prompts: Sequence[str], completions: Sequence[str]) -> tuple[int, int]:
    """(junk characters, characters) over the completions; completions[i] answers prompts[i]."""
    junk = total = 0
    for prompt, text in zip(prompts, completions, strict=True):
        scripts = frozenset(s for s in map(script, prompt) if s is not None)
        junk += sum(_is_junk(ch, scripts) for ch in text)
        total += len(text)
    return junk, total
