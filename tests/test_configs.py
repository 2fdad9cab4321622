"""Every config group composes and its settings instantiate; bad values fail naming the key."""

import pytest
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.models.tiny import build_char_tokenizer
from grpo_aug.pipeline import build_parts, prompt_datamodule, rollout_settings
from grpo_aug.prompts.datamodule import PromptDataModule
from helpers import TINY, compose_cfg


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
        ["algo/loss=constant_norm", "algo/beta=relax", "algo/kl=k2", "algo/winsorize=quantile"],
        ["prompts/selector=history", "prompts/difficulty=online", "rollout.oversample=2"],
        ["prompts/selector=learned", "prompts/curriculum=bandit"],
    ],
)
def test_groups_compose_and_instantiate(tmp_path, overrides):
    if "data=gsm8k" in overrides:  # the source checks its file at construction; ../shared may be absent
        data = tmp_path / "train.jsonl"
        data.write_text('{"question": "q", "answer": "<<1+1=2>>2\\n#### 2"}\n')
        overrides = [*overrides, f"data.source.path={data}"]
    cfg = compose_cfg(tmp_path, overrides)
    rollout_settings(cfg.rollout)
    selection = cfg.prompts.selector
    instantiate(selection, prompt_pool=lambda *a, **k: [])
    instantiate(cfg.algo, _convert_="all")
    assert len(instantiate(cfg.reward, _convert_="all").functions) >= 1
    dm = prompt_datamodule(cfg)
    assert isinstance(dm, PromptDataModule)
    for node in cfg.callbacks.values():
        instantiate(node)


BAD = [  # (overrides, what the message must say: the key, and the value or the allowed range)
    (["rollout.group_size=1"], r"rollout.group_size must be >= 2 .*got 1"),
    (["rollout.top_p=0"], r"rollout.top_p must be in \(0, 1\], got 0"),
    (["rollout.top_p=1.5"], r"rollout.top_p must be in \(0, 1\], got 1.5"),
    (["rollout.temperatures=[]"], r"rollout.temperatures is empty"),
    (["rollout.temperatures=[0.7,-1.0]"], r"rollout.temperatures\[1\] = -1.0 is negative"),
    (["rollout.max_new_tokens=0"], r"rollout.max_new_tokens must be >= 1, got 0"),
    (["rollout/dedup=ngram", "rollout.dedup.min_unique=5"], r"rollout.dedup.min_unique=5 exceeds rollout.group_size=4"),
    (["rollout/dedup=ngram", "rollout.dedup.threshold=1.5"], r"rollout.dedup.threshold must be in \(0, 1\], got 1.5"),
    (["rollout.filter.zero_std=true", "rollout.filter.max_rounds=-1"],
     r"rollout.filter.max_rounds must be >= 0, got -1"),
    (["algo.adv_clip=0"], r"algo.adv_clip must be > 0, got 0"),
    (["algo.clip_eps_low=1.0"], r"algo.clip_eps_low must be in \[0, 1\), got 1.0"),
    (["algo.clip_ratio_c=0.5"], r"algo.clip_ratio_c must be > 1 or null, got 0.5"),
    (["algo.entropy_coef=-0.1"], r"algo.entropy_coef must be >= 0, got -0.1"),
    (["algo.ratio=sequence"], r"algo.ratio must be a level from the algo/ratio group"),
    (["algo.clip_eps_high=-0.1"], r"algo.clip_eps_high must be in \[0, 1\), got -0.1"),
    (["algo.kl=k4"], r"algo.kl must be an estimator from the algo/kl group .*got 'k4'"),
    (["algo.num_iterations=0"], r"algo.num_iterations must be >= 1, got 0"),
    (["algo.minibatches=0"], r"algo.minibatches must be >= 1, got 0"),
    (["algo.length_chunks=0"], r"algo.length_chunks must be >= 1, got 0"),
    (["algo.max_consecutive_nonfinite=0"], r"algo.max_consecutive_nonfinite must be >= 1, got 0"),
    (["algo.beta.value=-0.1"], r"algo.beta.value"),
    (["algo.template_patterns=['(']"], r"algo.template_patterns\[0\] = '\(' is not a valid regex"),
    (["algo/winsorize=quantile", "algo.winsorize.lower=0.9", "algo.winsorize.upper=0.1"],
     r"algo.winsorize needs 0 <= lower < upper <= 1, got lower=0.9, upper=0.1"),
    (["reward.functions.0.weight=-1"], r"reward.functions\[0\].weight must be a finite number >= 0, got -1"),
    (["reward.on_error=ignore"], r"reward.on_error must be one of .*got 'ignore'"),
    (["reward.timeout_s=0"], r"reward.timeout_s must be > 0 or null, got 0"),
    (["callbacks.alerts.low_std=-0.1"], r"callbacks.alerts.low_std must be >= 0, got -0.1"),
    (["callbacks.alerts.window=1"], r"callbacks.alerts.window must be >= 2, got 1"),
    (["prompts/curriculum=staged", "prompts.curriculum.stages.0.weights.easy=0.5"],
     r"prompts.curriculum.stages\[0\].weights: weights must sum to 1, got 0.5"),
    (["prompts/curriculum=staged", "+prompts.curriculum.stages.0.weights.expert=0.0"],
     r"prompts.curriculum.stages\[0\].weights: unknown bucket 'expert'"),
    (["prompts/curriculum=bandit", "prompts.curriculum.explore=0"],
     r"prompts.curriculum.explore must be in \(0, 1\] .*got 0"),
    (["prompts/curriculum=bandit", "prompts.curriculum.initial.medium=2"],
     r"prompts.curriculum.initial.medium must be in \[0, 1\] .*got 2"),
    (["data.batch_size=0"], r"data.batch_size must be >= 1, got 0"),
    (["model.optimizer.lr=0"], r"model.optimizer.lr must be > 0, got 0"),
    (["model.optimizer.lr=-1e-4"], r"model.optimizer.lr must be > 0, got -0.0001"),
    (["model.lr_final_ratio=1.5"], r"model.lr_final_ratio must be in \[0, 1\], got 1.5"),
    (["trainer.max_steps=0"], r"trainer.max_steps must be >= 1 .*got 0"),
    (["data=gsm8k", "data.source.path=/no/such/train.jsonl"], r"data.source.path='/no/such/train.jsonl': no such file"),
]


@pytest.mark.parametrize("overrides, message", BAD)
def test_bad_values_stop_before_anything_loads(tmp_path, overrides, message):
    """The real build path (pipeline.build_parts) refuses the value before it reads data or
    builds a model: the cache, where models and warm-ups are written, stays empty."""
    fast = [] if "data=gsm8k" in overrides else ["debug=fast"]  # debug=fast sizes the synthetic source
    cfg = compose_cfg(tmp_path, [*fast, *overrides])
    with pytest.raises((ValueError, FileNotFoundError, InstantiationException), match=message):
        build_parts(cfg)
    assert not (tmp_path / "cache").exists()


def test_unknown_loss_variant_fails_at_compose(tmp_path):
    with pytest.raises(Exception, match="algo/loss"):
        compose_cfg(tmp_path, ["algo/loss=sum_of_squares"])


def test_unknown_model_path_is_named(tmp_path):
    cfg = compose_cfg(tmp_path, ["debug=fast", "model=hf", "model.name_or_path=/no/such/model"])
    with pytest.raises(ValueError, match=r"model.name_or_path=./no/such/model.: cannot load a tokenizer"):
        build_parts(cfg)


def test_the_default_budget_fits_every_easy_and_medium_solution(tmp_path):
    """A completion cut before its '#### N' line is scored by its last number: a budget that does
    not fit the reference solutions trains on truncated text and reports it as right or wrong by
    where the cut falls."""
    budget = compose_cfg(tmp_path, []).rollout.max_new_tokens
    tokenizer = build_char_tokenizer()
    longest = 0
    for r in SyntheticArithmetic(seed=0).load():
        if r.bucket == "hard":  # out of the tiny model's reach by design
            continue
        n = len(tokenizer(r.solution, add_special_tokens=False).input_ids)
        assert n == len(r.solution)  # one token per character
        longest = max(longest, n + 1)  # + EOS
    assert 40 <= longest <= budget, (longest, budget)


def test_the_module_is_one_instantiate_of_its_config_and_a_stage_swaps_by_config(tmp_path):
    from grpo_aug.models.module import GRPOModule
    from grpo_aug.update import PolicyUpdate

    cfg = compose_cfg(tmp_path, ["debug=fast", *TINY, "module.update._target_=helpers.SwappedUpdate",
                                 "algo.clip_eps_high=0.28", "rollout.group_size=4"])
    module, datamodule, _ = build_parts(cfg)
    assert isinstance(module, GRPOModule) and type(module.update).__name__ == "SwappedUpdate"
    assert isinstance(module.update, PolicyUpdate) and module.update.algo.clip_eps_high == 0.28
    # the stages hold the run's objects: the DataModule's history and schedule, the rollout's settings
    assert module.feed.history is datamodule.history and module.feed.schedule is datamodule.schedule
    assert module.rollout.settings.group_size == 4 and module.rollout.prompt_pool == datamodule.draw_prompts


@pytest.mark.parametrize("overrides, words", [
    (["trainer=deepspeed", "rollout/engine=vllm"], "rollout/engine=vllm under trainer=deepspeed"),
    (["trainer=fsdp", "rollout/engine=vllm", "model/lora=on"], "rollout/engine=vllm with model/lora=on under "
                                                                "trainer=fsdp"),
    (["trainer=fsdp", "model/lora=on", "model.lora.merge_on_save=true"], "merge_on_save=true is not supported"),
    (["rollout.ahead=1", "rollout/engine=vllm"], "rollout.ahead=1 samples on a second thread .* use "
                                                 "rollout/engine=vllm_server"),
    (["rollout.ahead=2", "trainer=fsdp"], "rollout.ahead=2 with the hf engine under sharded weights"),
    (["rollout.ahead=-1"], "rollout.ahead must be an integer >= 0"),
    (["rollout.ahead=1", "rollout.filter.refill=true"], "rollout.ahead=1 with rollout.filter.refill=true"),
    (["rollout/engine=vllm_server", "rollout.engine.url=localhost:8000"], "rollout.engine.url must be an http"),
])
def test_scale_out_combinations_that_cannot_run_are_refused_before_anything_loads(tmp_path, overrides, words,
                                                                                   monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was built before the refusal")

    monkeypatch.setattr("grpo_aug.pipeline.prepare_model", no_model)
    with pytest.raises(ValueError, match=words):
        build_parts(compose_cfg(tmp_path, [*TINY, *overrides]))


def test_the_collective_timeout_is_a_config_value_the_strategies_take(tmp_path):
    import datetime

    for trainer in ("ddp", "fsdp"):
        cfg = compose_cfg(tmp_path, [f"trainer={trainer}", "trainer.strategy.timeout.seconds=42"])
        strategy = instantiate(cfg.trainer.strategy)
        assert strategy._timeout == datetime.timedelta(seconds=42)
