"""Warm-up starts shipped in the package, so that the default job starts from the same weights on
every machine.

A supervised warm-up of 1,000 Adam steps amplifies the last bits in which CPU kernels and thread
counts differ: the same config built another start on another machine (held-out easy 0.340 where
this one builds 0.155-0.210), and from it the default run learned something else. The start of the
default job is therefore built once, shipped under `warmup/starts/<name>/` with the SHA-256 of its
weights, and loaded wherever a warm-up's recipe is the shipped one. The recipe names the base
model by its build settings (the tiny model's), not by the bytes of its files, which differ with
the transformers version that wrote them. Any other seed, model or setting builds its own warm-up.

    python scripts/ship_start.py        # rebuilds the shipped start and its manifest entry
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from grpo_aug.errors import UsageError

STARTS = Path(__file__).resolve().parent / "starts"
MANIFEST = STARTS / "manifest.json"
WEIGHTS = "model.safetensors"
RECIPE = "warmup_recipe.json"  # written beside every warm-up of a tiny model (warmup/supervised.py)


def recipe_key(recipe: dict) -> str:
    """A name for everything that determines a warm-up, machine aside."""
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def manifest() -> dict[str, dict]:
    return json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {}


def shipped_start(recipe: dict) -> Path | None:
    """The shipped directory whose recipe is `recipe`, after checking its weights' hash; None if
    no shipped start has this recipe."""
    key = recipe_key(recipe)
    for name, entry in manifest().items():
        if entry["recipe_key"] != key:
            continue
        path = STARTS / name
        weights = path / WEIGHTS
        if not weights.is_file():
            raise UsageError(f"the shipped start {path} has no {WEIGHTS}: reinstall grpo-aug, or set "
                             "model.warmup.shipped=false to build the warm-up here")
        found = file_sha256(weights)
        if found != entry["sha256"]:
            raise UsageError(f"the shipped start {weights} has SHA-256 {found}, not {entry['sha256']} "
                             f"({MANIFEST}): reinstall grpo-aug, or set model.warmup.shipped=false")
        return path
    return None
