"""The config tree follows the code: each group's `_target_`s live in the package of its stage, a
stage's node in conf/module/grpo.yaml reads only its own groups, and old override names still work."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo_aug.config_renames import rewrite
from helpers import ROOT, compose_cfg

CONF = ROOT / "conf"

# config group (its folder under conf/) -> the packages its `_target_`s may name. The deepest
# listed folder decides; a new group must be added here, with the package it builds from.
GROUP_PACKAGES = {
    "model": ("grpo_aug.models.", "torch.optim."),
    "data": ("grpo_aug.data.", "grpo_aug.prompts.datamodule.PromptDataModule"),  # the LightningDataModule
    "prompts": ("grpo_aug.prompts.",),
    "rollout": ("grpo_aug.rollout.",),
    "rollout/engine": ("grpo_aug.engines.",),
    "rollout/tools": ("grpo_aug.tools.",),
    "reward": ("grpo_aug.rewards.",),
    "answer": ("grpo_aug.rewards.AnswerFormat",),  # one format shared by rewards, evaluation, reflection
    "algo": ("grpo_aug.algo.",),
    "module": ("grpo_aug.models.", "grpo_aug.prompts.PromptFeed", "grpo_aug.rollout.GroupRollout",
               "grpo_aug.update.PolicyUpdate"),
    "trainer": ("lightning.", "grpo_aug.models.sharding.", "datetime.timedelta"),
    "callbacks": ("grpo_aug.callbacks.", "lightning.pytorch.callbacks."),
    "logger": ("lightning.pytorch.loggers.",),
    "paths": (),
    "debug": (),
}
# experiments wire a whole recipe (a user's reward functions included): not a group of one stage
NOT_A_STAGE = {"experiment"}


def _group(path: Path, conf: Path) -> str:
    folders = path.relative_to(conf).parent.parts
    for depth in range(len(folders), 0, -1):
        if "/".join(folders[:depth]) in GROUP_PACKAGES:
            return "/".join(folders[:depth])
    raise AssertionError(f"{path.relative_to(conf)}: its group {'/'.join(folders)} is not in GROUP_PACKAGES")


def _targets(node) -> list[str]:
    if isinstance(node, dict):
        own = [node["_target_"]] if isinstance(node.get("_target_"), str) else []
        return own + [t for v in node.values() for t in _targets(v)]
    if isinstance(node, list):
        return [t for v in node for t in _targets(v)]
    return []


def misplaced_targets(conf: Path) -> list[str]:
    """`<file>: <target>` for every `_target_` outside its group's packages."""
    found = []
    for path in sorted(conf.rglob("*.yaml")):
        folders = path.relative_to(conf).parent.parts
        if not folders or folders[0] in NOT_A_STAGE:
            continue  # conf/train.yaml: the run's own settings (eval, preflight)
        allowed = GROUP_PACKAGES[_group(path, conf)]
        for target in _targets(yaml.safe_load(path.read_text())):
            if not target.startswith(allowed):
                found.append(f"{path.relative_to(conf)}: {target}")
    return found


def test_every_group_builds_from_its_stages_package():
    assert misplaced_targets(CONF) == []


def test_a_target_in_another_stages_group_is_found(tmp_path):
    # the layout before this rule: the prompt selector under rollout/
    planted = tmp_path / "conf"
    (planted / "rollout" / "selector").mkdir(parents=True)
    (planted / "rollout" / "selector" / "none.yaml").write_text(
        "_target_: grpo_aug.prompts.selection.PromptSelection\n")
    assert misplaced_targets(planted) == ["rollout/selector/none.yaml: grpo_aug.prompts.selection.PromptSelection"]


# conf/module/grpo.yaml wires the stages: each node may read the groups of its own stage, and the
# shared settings (seed, the answer format)
STAGE_GROUPS = {
    "policy": {"model"},
    "feed": {"prompts"},
    "rollout": {"rollout", "seed"},
    "update": {"algo"},
    "optimization": {"model"},
    "evaluation": {"answer", "eval", "model"},
}


def test_each_stage_reads_only_its_own_groups():
    module = yaml.safe_load((CONF / "module" / "grpo.yaml").read_text())
    assert set(STAGE_GROUPS) <= set(module)
    for stage, groups in STAGE_GROUPS.items():
        read = set(re.findall(r"\$\{(\w+)", yaml.safe_dump(module[stage])))
        assert read <= groups, f"module.{stage} reads {sorted(read - groups)}: another stage's settings"


@pytest.mark.parametrize("old, new", [
    ("curriculum=adaptive", "prompts/curriculum=adaptive"),
    ("curriculum.explore=0.3", "prompts.curriculum.explore=0.3"),
    ("rollout/selector=learned", "prompts/selector=learned"),
    ("rollout.selector.predictor.warmup_groups=2", "prompts.selector.predictor.warmup_groups=2"),
    ("data/difficulty=online", "prompts/difficulty=online"),
    ("+data.difficulty.margin=0.05", "+prompts.difficulty.margin=0.05"),
    ("reward/winsorize=quantile", "algo/winsorize=quantile"),
    ("reward.winsorize.lower=0.05", "algo.winsorize.lower=0.05"),
    ("algo.overlong_buffer=8", "reward.overlong_buffer=8"),
    ("~algo.overlong_penalty", "~reward.overlong_penalty"),
    ("algo.lean=false", "algo.fast_llama=false"),
])
def test_old_override_names_are_rewritten(old, new):
    out, notices = rewrite([old])
    assert out == [new]
    assert len(notices) == 1 and new.lstrip("+~").split("=")[0] in notices[0]


@pytest.mark.parametrize("kept", [
    "prompts/curriculum=bandit", "curriculum_weight=1", "data.batch_size=8", "reward=model",
    "rollout.selectorx=1", "algo.overlong_bufferx=1", "--multirun", "data.source.columns.difficulty=level",
])
def test_other_overrides_pass_unchanged(kept):
    assert rewrite([kept]) == ([kept], [])


def test_rewritten_old_names_compose_to_the_new_config(tmp_path):
    old = ["curriculum=adaptive", "rollout/selector=learned", "data/difficulty=online", "reward/winsorize=quantile",
           "algo.overlong_buffer=8"]
    new, _ = rewrite(old)
    cfg = compose_cfg(tmp_path, new)
    assert cfg.prompts.curriculum._target_.endswith("AdaptiveSchedule")
    assert cfg.prompts.selector._target_.endswith("RankedSelection")
    assert cfg.prompts.difficulty._target_.endswith("OnlineDifficulty")
    assert cfg.algo.winsorize._target_.endswith("winsorize.Winsorize")
    assert cfg.reward.overlong_buffer == 8


def test_train_py_accepts_an_old_name_with_one_notice():
    done = subprocess.run(
        [sys.executable, "train.py", "curriculum=adaptive", "--cfg", "job", "--package", "prompts.curriculum"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "AdaptiveSchedule" in done.stdout
    notices = [line for line in done.stderr.splitlines() if "is now" in line]
    assert notices == ["grpo-aug: `curriculum` is now `prompts/curriculum` (CHANGELOG.md, 2026-12-06); "
                       "the old name still works for now"]
