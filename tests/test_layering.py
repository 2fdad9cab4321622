"""The package's layering, checked in a fresh interpreter: importing every module of a layer loads
nothing from a layer above it (a lower folder never imports a higher one)."""

import pkgutil
import subprocess
import sys

import grpo_aug

# lowest first; a module may import its own layer and the ones before it
LAYERS = [
    ["grpo_aug.errors", "grpo_aug.mathtext", "grpo_aug.answers", "grpo_aug.eventlog", "grpo_aug.resume",
     "grpo_aug.distributed", "grpo_aug.progress", "grpo_aug.quiet", "grpo_aug.summary"],
    ["grpo_aug.algo"],
    ["grpo_aug.lean"],
    ["grpo_aug.data"],
    ["grpo_aug.rewards"],
    ["grpo_aug.tools"],
    ["grpo_aug.rollout", "grpo_aug.report"],
    ["grpo_aug.prompts"],
    ["grpo_aug.update"],
    ["grpo_aug.callbacks", "grpo_aug.models", "grpo_aug.dashboard"],
    ["grpo_aug.pipeline", "grpo_aug.preflight"],
]


def _modules(name: str) -> list[str]:
    module = __import__(name, fromlist=["_"])
    if not hasattr(module, "__path__"):
        return [name]
    return [name] + [m.name for m in pkgutil.walk_packages(module.__path__, prefix=name + ".")]


def test_every_module_is_in_a_layer():
    every = {m.name.split(".")[1] for m in pkgutil.iter_modules(grpo_aug.__path__, prefix="grpo_aug.")}
    placed = {name.split(".")[1] for layer in LAYERS for name in layer}
    assert every == placed


def test_no_layer_imports_one_above_it():
    # one fresh interpreter imports the layers lowest first: after each, nothing above it is loaded
    steps = []
    for level in range(len(LAYERS) - 1):
        mine = [m for name in LAYERS[level] for m in _modules(name)]
        above = tuple(name for layer in LAYERS[level + 1 :] for name in layer)
        steps.append(f"for m in {mine!r}: importlib.import_module(m)\n"
                     f"print({level}, sorted(m for m in sys.modules if m.startswith({above!r})))")
    code = "import importlib, sys\n" + "\n".join(steps)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for level, line in enumerate(out.strip().splitlines()):
        assert line == f"{level} []", f"{LAYERS[level]} import {line}"
    assert len(out.strip().splitlines()) == len(LAYERS) - 1
