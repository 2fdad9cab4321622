"""The default job starts from the shipped warm-up: the same weights on every machine, with the hash
the docs give, and the step-0 held-out accuracy the README shows."""

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from hydra.utils import instantiate

import grpo_aug.warmup.shipped as shipped
import grpo_aug.warmup.supervised as warmup
from grpo_aug.pipeline import check_tools, evaluate, prepare_model, prompt_datamodule
from grpo_aug.warmup.shipped import MANIFEST, STARTS, WEIGHTS
from helpers import ROOT, compose_cfg

START = STARTS / "default-seed0"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()  # hashlib in one call, not the module's reader


def test_the_shipped_weights_have_the_documented_hash():
    entry = json.loads(MANIFEST.read_text())["default-seed0"]
    digest = _sha256(START / WEIGHTS)
    assert digest == entry["sha256"]
    assert digest in (ROOT / "docs" / "default-run.md").read_text(), "docs/default-run.md gives another hash"


def _prepare(tmp_path, overrides):
    cfg = compose_cfg(tmp_path, overrides)
    model = instantiate(cfg.model)
    datamodule = prompt_datamodule(cfg)
    datamodule.setup("fit")
    return prepare_model(model, datamodule.train_records, cfg.paths.cache_dir, cfg.seed, check_tools(cfg))


def test_the_default_job_loads_the_shipped_start_and_builds_nothing(tmp_path, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("the default job built a warm-up instead of loading the shipped start")

    monkeypatch.setattr(warmup, "load_policy", no_build)
    assert Path(_prepare(tmp_path, [])) == START
    # another seed, or a setting moved, is another recipe: it builds its own (here: refused)
    for other in (["seed=1"], ["model.warmup.steps=999"], ["model.warmup.seed=1"], ["model.warmup.off_by_one=0.6"],
                  ["model.warmup.shipped=false"]):
        with pytest.raises(AssertionError, match="built a warm-up"):
            _prepare(tmp_path, other)


def test_a_damaged_shipped_start_is_refused_with_its_path(tmp_path, monkeypatch):
    copy = tmp_path / "starts"
    shutil.copytree(STARTS, copy)
    weights = copy / "default-seed0" / WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(shipped, "STARTS", copy)
    monkeypatch.setattr(shipped, "MANIFEST", copy / "manifest.json")
    recipe = json.loads(MANIFEST.read_text())["default-seed0"]["recipe"]
    with pytest.raises(ValueError, match=re.escape(str(weights))):
        shipped.shipped_start(recipe)
    assert shipped.shipped_start({**recipe, "seed": 1}) is None


def test_the_shipped_start_scores_the_readmes_step_0_accuracy(tmp_path):
    """Greedy held-out accuracy of the shipped start, by `python train.py mode=eval`, against the
    start column of the README's run summary."""
    readme = (ROOT / "README.md").read_text()
    shown = {b: float(v) for b, v in re.findall(r"^\s+(easy|medium|hard)\s+([01]\.\d{3})\s", readme, re.M)}
    assert set(shown) == {"easy", "medium", "hard"}, "the README's run summary lost its start column"
    metrics = evaluate(compose_cfg(tmp_path, ["mode=eval", "logger=csv"]))
    for bucket, value in shown.items():
        assert metrics[f"eval/accuracy/{bucket}"] == pytest.approx(value, abs=5e-4), bucket
