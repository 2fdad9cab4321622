"""One place for defaults: a value the YAML sets for one of grpo-aug's classes is not also a
different Python default. Where config options set a key differently (model/tiny vs model/hf),
the class has no default for it at all."""

import dataclasses
import importlib
import inspect
from collections import defaultdict
from pathlib import Path

from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[1] / "conf"
MISSING = object()


def python_defaults(target: str) -> dict:
    module, name = target.rsplit(".", 1)
    obj = getattr(importlib.import_module(module), name)
    if dataclasses.is_dataclass(obj):
        out = {}
        for f in dataclasses.fields(obj):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
        return out
    signature = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    return {k: p.default for k, p in signature.parameters.items() if p.default is not inspect.Parameter.empty}


def plain(value):
    """A YAML value as Python compares it; MISSING for nodes, interpolations and '???'."""
    if isinstance(value, str) and ("${" in value or value == "???"):
        return MISSING
    if isinstance(value, dict):
        return MISSING
    if isinstance(value, list):
        return MISSING if any(isinstance(v, (dict, list)) for v in value) else list(value)
    return value


def yaml_settings() -> dict[tuple[str, str], dict[str, object]]:
    """(target, key) -> {file: value} for every plain key of every grpo_aug node in conf/."""
    found = defaultdict(dict)

    def walk(node, where):
        if isinstance(node, dict):
            target = node.get("_target_", "")
            for key, value in node.items():
                if target.startswith("grpo_aug.") and not key.startswith("_"):
                    found[(target, key)][where] = value
                walk(value, where)
        elif isinstance(node, list):
            for value in node:
                walk(value, where)

    for path in sorted(CONF.rglob("*.yaml")):
        if path.parent.name == "experiment":  # an experiment lists what it changes, on purpose
            continue
        walk(OmegaConf.to_container(OmegaConf.load(path), resolve=False), str(path.relative_to(CONF)))
    return found


def test_yaml_and_python_defaults_never_disagree():
    problems = []
    for (target, key), by_file in sorted(yaml_settings().items()):
        defaults = python_defaults(target)
        if key not in defaults:
            continue
        default = defaults[key]
        default = list(default) if isinstance(default, tuple) else default
        for where, value in by_file.items():
            value = plain(value)
            if value is MISSING or callable(default) or hasattr(default, "__dict__"):
                continue  # a nested node (checked on its own), an interpolation or a required value
            if value != default:
                problems.append(f"{target}: {key} is {value!r} in conf/{where} but {default!r} in Python")
    assert not problems, "\n".join(problems)


def test_the_checker_sees_a_disagreement(tmp_path, monkeypatch):
    """The check above can fail: a YAML value that differs from the Python default is reported."""
    (tmp_path / "x.yaml").write_text("_target_: grpo_aug.rollout.settings.RolloutSettings\ngroup_size: 3\n")
    monkeypatch.setattr(__import__(__name__), "CONF", tmp_path)
    found = yaml_settings()
    assert found[("grpo_aug.rollout.settings.RolloutSettings", "group_size")] == {"x.yaml": 3}
    assert python_defaults("grpo_aug.rollout.settings.RolloutSettings")["group_size"] != 3
