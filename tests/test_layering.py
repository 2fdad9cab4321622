"""The package's layering, checked in a fresh interpreter: importing every module of a layer loads
nothing from a layer above it (a lower folder never imports a higher one). The three stages of a
step (prompts, rollout, update) import the contracts in step_types.py, not each other, read from
the source (relative imports and imports under TYPE_CHECKING included). And no import circle
between any two modules of src/ (imports inside functions included: they only postpone a circle)."""

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import grpo_aug

# lowest first; a module may import its own layer and the ones before it
LAYERS = [
    ["grpo_aug.errors", "grpo_aug.mathtext", "grpo_aug.answers", "grpo_aug.eventlog", "grpo_aug.resume",
     "grpo_aug.distributed", "grpo_aug.progress", "grpo_aug.quiet", "grpo_aug.summary", "grpo_aug.dtypes",
     "grpo_aug.host_memory", "grpo_aug.junk_chars", "grpo_aug.config_renames", "grpo_aug.step_clock"],
    ["grpo_aug.algo"],
    ["grpo_aug.fast_llama"],
    ["grpo_aug.data"],
    ["grpo_aug.rewards"],
    ["grpo_aug.tools"],
    ["grpo_aug.engines"],
    ["grpo_aug.step_types"],
    ["grpo_aug.report"],
    ["grpo_aug.prompts"],
    ["grpo_aug.rollout"],
    ["grpo_aug.update"],
    ["grpo_aug.callbacks", "grpo_aug.models", "grpo_aug.dashboard", "grpo_aug.warmup"],
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


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its source. `from a.b import c` is
    an edge to a.b.c when that is a module, else to a.b; a relative import (`from ..a import b`)
    is resolved against the importing module's package first."""
    files = {".".join((package, *f.relative_to(root).with_suffix("").parts)).removesuffix(".__init__"): f
             for f in root.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        edges = set()
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]  # the package `.` means
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                module = node.module if node.level == 0 else ".".join(p for p in (base, node.module) if p)
                edges |= {f"{module}.{a.name}" if f"{module}.{a.name}" in files else module for a in node.names}
        graph[name] = {e for e in edges if e in files and e != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_the_package():
    graph = import_graph(Path(grpo_aug.__file__).parent, "grpo_aug")
    assert len(graph) > 100 and "grpo_aug.engines.weight_sync" in graph["grpo_aug.engines.vllm_server"]
    assert circles(graph) == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package `pkg` under tmp_path with these files (paths relative to it) and texts."""
    pkg = tmp_path / "pkg"
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return pkg


def test_a_planted_circle_is_found(tmp_path):
    """Two modules that import each other, one of them only inside a function, beside a chain."""
    pkg = _package(tmp_path, {"__init__.py": "", "sub/__init__.py": "", "a.py": "from pkg.sub import b\n",
                              "sub/b.py": "import os\n\ndef f():\n    from pkg.a import X\n    return X\n",
                              "c.py": "import pkg.a\n"})
    graph = import_graph(pkg, "pkg")
    assert graph == {"pkg": set(), "pkg.sub": set(), "pkg.a": {"pkg.sub.b"}, "pkg.sub.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    assert circles(graph) == [["pkg.a", "pkg.sub.b"]]


def test_a_circle_through_relative_imports_is_found(tmp_path):
    """`from .. import a` in pkg.sub.b and `from .sub.b import f` in pkg.a: the same circle."""
    pkg = _package(tmp_path, {"__init__.py": "", "sub/__init__.py": "from . import b\n",
                              "a.py": "from .sub.b import f\n",
                              "sub/b.py": "def f():\n    from .. import a\n    return a\n"})
    graph = import_graph(pkg, "pkg")
    assert graph == {"pkg": set(), "pkg.sub": {"pkg.sub.b"}, "pkg.a": {"pkg.sub.b"}, "pkg.sub.b": {"pkg.a"}}
    assert circles(graph) == [["pkg.a", "pkg.sub.b"]]


STAGES = ("prompts", "rollout", "update")


def stage_crossings(graph: dict[str, set[str]], package: str) -> list[str]:
    """Imports from one stage's modules into another stage's: `a -> b` for each."""
    def stage(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 and parts[0] == package and parts[1] in STAGES else None

    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                  if stage(m) and stage(t) and stage(m) != stage(t))


def test_the_stages_import_the_contracts_not_each_other():
    graph = import_graph(Path(grpo_aug.__file__).parent, "grpo_aug")
    assert "grpo_aug.step_types" in graph["grpo_aug.rollout.groups"]
    assert stage_crossings(graph, "grpo_aug") == []


def test_a_planted_stage_crossing_is_found(tmp_path):
    """update/ reading a type from prompts/ under TYPE_CHECKING, through a relative import."""
    pkg = _package(tmp_path, {"__init__.py": "", "step_types.py": "", "prompts/__init__.py": "",
                              "prompts/feed.py": "from ..step_types import *\n", "update/__init__.py": "",
                              "update/step.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                "    from ..prompts.feed import Picked\n"})
    graph = import_graph(pkg, "pkg")
    assert stage_crossings(graph, "pkg") == ["pkg.update.step -> pkg.prompts.feed"]
