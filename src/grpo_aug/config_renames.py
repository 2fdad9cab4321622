"""Override names from before the config tree followed the code (CHANGELOG.md, 2026-12-06).

The groups now sit with the stage whose package holds their `_target_`s: the curriculum, the
prompt selector and the difficulty tiers drive the prompt stage (`prompts/`), the reward clipping
before the advantages is part of the update's maths (`algo/`), the overlong shaping is a reward
term (`reward`); `algo.lean` is named for the package it switches on (`grpo_aug.fast_llama`). A
command line written with the old names keeps working: each old name is rewritten to its new one
with a one-line notice. Experiment files are not rewritten (Hydra reads
them itself): theirs must use the new names.
"""

from __future__ import annotations

from collections.abc import Sequence

# old key path -> new key path, dotted; a group choice (`a/b=x`) is the same path with slashes
RENAMES = {
    "curriculum": "prompts.curriculum",
    "rollout.selector": "prompts.selector",
    "data.difficulty": "prompts.difficulty",
    "reward.winsorize": "algo.winsorize",
    "algo.overlong_buffer": "reward.overlong_buffer",
    "algo.overlong_penalty": "reward.overlong_penalty",
    "algo.lean": "algo.fast_llama",
}

_PREFIXES = ("++", "+", "~")


def _renamed(key: str) -> str | None:
    """The new name of an override's key (dotted or slashed), or None if it was not renamed."""
    slashed = "/" in key or "." not in key  # a group choice: `rollout/selector=x`, `curriculum=x`
    dotted = key.replace("/", ".")
    for old, new in RENAMES.items():
        if dotted == old or dotted.startswith(old + "."):
            moved = new + dotted[len(old):]
            return moved.replace(".", "/") if slashed else moved
    return None


def rewrite(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """Command-line overrides with old names rewritten, and one notice per rewrite.

    `curriculum=adaptive` -> `prompts/curriculum=adaptive`, `rollout.selector.predictor.lr=0.1` ->
    `prompts.selector.predictor.lr=0.1`; flags (`--multirun`), values and new names pass unchanged."""
    out, notices = [], []
    for arg in overrides:
        if arg.startswith("-"):
            out.append(arg)
            continue
        prefix = next((p for p in _PREFIXES if arg.startswith(p)), "")
        key, sep, value = arg[len(prefix):].partition("=")
        new = _renamed(key)
        if new is None:
            out.append(arg)
            continue
        out.append(f"{prefix}{new}{sep}{value}")
        notices.append(f"grpo-aug: `{prefix}{key}` is now `{prefix}{new}` (CHANGELOG.md, 2026-12-06); "
                       f"the old name still works for now")
    return out, notices
