"""Every config group composes and its settings instantiate; bad values fail naming the key."""

import pytest
from hydra.utils import instantiate

from helpers import compose_cfg

from grpo_aug.data.datamodule import PromptDataModule


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["data=gsm8k"],
        ["model=hf", "model.name_or_path=some/model"],
        ["trainer=ddp"],
        ["trainer=gpu"],
        ["logger=csv"],
        ["debug=fast"],
        ["rollout/dedup=ngram"],
        ["callbacks=[default,adaptive_temperature]"],
    ],
)
def test_groups_compose_and_instantiate(tmp_path, overrides):
    cfg = compose_cfg(tmp_path, overrides)
    instantiate(cfg.rollout)
    instantiate(cfg.algo)
    assert len(instantiate(cfg.reward.functions, _convert_="all")) >= 1
    schedule = instantiate(cfg.curriculum)
    dm = instantiate(cfg.data, schedule=schedule, total_steps=cfg.trainer.max_steps)
    assert isinstance(dm, PromptDataModule)
    for node in cfg.callbacks.values():
        instantiate(node)


@pytest.mark.parametrize(
    "override, message",
    [
        ("algo.beta=-0.1", "algo.beta"),
        ("algo.clip_eps=1.5", "algo.clip_eps"),
        ("rollout.top_p=0", "rollout.top_p"),
        ("rollout.max_new_tokens=0", "rollout.max_new_tokens"),
        ("rollout.dedup.threshold=1.5", "rollout.dedup.threshold"),
        ("rollout.dedup.min_unique=9", "rollout.dedup.min_unique=9 exceeds rollout.group_size=8"),
    ],
)
def test_bad_values_name_the_key(tmp_path, override, message):
    dedup = ["rollout/dedup=ngram"] if override.startswith("rollout.dedup") else []
    cfg = compose_cfg(tmp_path, dedup + [override])
    with pytest.raises(Exception, match=message):
        instantiate(cfg.rollout)
        instantiate(cfg.algo)
