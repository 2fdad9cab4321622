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
        ["reward=soft_math"],
        ["reward=similarity"],
        ["algo/loss=token_mean", "algo/beta=linear"],
        ["algo/loss=constant_norm", "algo/beta=relax", "algo.kl=k2"],
    ],
)
def test_groups_compose_and_instantiate(tmp_path, overrides):
    cfg = compose_cfg(tmp_path, overrides)
    instantiate(cfg.rollout)
    instantiate(cfg.algo, _convert_="all")
    assert len(instantiate(cfg.reward, _convert_="all").functions) >= 1
    schedule = instantiate(cfg.curriculum)
    dm = instantiate(cfg.data, schedule=schedule, total_steps=cfg.trainer.max_steps)
    assert isinstance(dm, PromptDataModule)
    for node in cfg.callbacks.values():
        instantiate(node)


@pytest.mark.parametrize(
    "override, message",
    [
        ("algo.beta.value=-0.1", "algo.beta.value"),
        ("algo.beta=0.1", "algo.beta must be a schedule"),
        ("algo.clip_eps_low=1.5", "algo.clip_eps_low"),
        ("algo.clip_eps_high=0", "algo.clip_eps_high"),
        ("algo.kl=k4", "algo.kl must be one of"),
        ("algo.num_iterations=0", "algo.num_iterations"),
        ("algo.template_patterns=[\'(\']", "algo.template_patterns\\[0\\]"),
        ("reward.winsorize.lower=0.995", "reward.winsorize needs 0 <= lower < upper <= 1"),
        ("reward.winsorize.upper=1.5", "reward.winsorize needs 0 <= lower < upper <= 1"),
        ("reward.functions.0.weight=-1", "reward.functions\\[0\\].weight"),
        ("reward.on_error=ignore", "reward.on_error"),
        ("rollout.top_p=0", "rollout.top_p"),
        ("rollout.max_new_tokens=0", "rollout.max_new_tokens"),
        ("rollout.dedup.threshold=1.5", "rollout.dedup.threshold"),
        ("rollout.dedup.min_unique=17", "rollout.dedup.min_unique=17 exceeds rollout.group_size=16"),
    ],
)
def test_bad_values_name_the_key(tmp_path, override, message):
    dedup = ["rollout/dedup=ngram"] if override.startswith("rollout.dedup") else []
    cfg = compose_cfg(tmp_path, dedup + [override])
    with pytest.raises(Exception, match=message):
        instantiate(cfg.rollout)
        instantiate(cfg.algo, _convert_="all")
        instantiate(cfg.reward, _convert_="all")


def test_unknown_loss_variant_fails_at_compose(tmp_path):
    with pytest.raises(Exception, match="algo/loss"):
        compose_cfg(tmp_path, ["algo/loss=sum_of_squares"])
