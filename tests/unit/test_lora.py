"""LoRA: the reference is the base model (adapter off), only the adapter trains, checkpoints hold
the adapter alone, and the final policy is the adapter (plus the merged model on request)."""

import functools

import pytest
import torch

from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.models.loading import load_policy
from grpo_aug.models.lora import Lora
from grpo_aug.rollout.filter import GroupFilter
from grpo_aug.rollout.settings import RolloutSettings
from helpers import TINY, make_module, prepared, train_here

EASY = [r for r in SyntheticArithmetic(size_per_bucket=10, seed=0).load() if r.bucket == "easy"]


def _module(path, lora):
    m = make_module(path, rollout=RolloutSettings(group_size=4, temperatures=(1.0,), top_p=1.0, max_new_tokens=6,
                                                  filter=GroupFilter(zero_std=False)), lora=lora,
                    optimizer=functools.partial(torch.optim.AdamW, lr=1e-2))
    m.configure_model()
    return m


def test_the_reference_is_the_base_model_and_no_copy_is_held(tiny_model_dir):
    m = _module(tiny_model_dir, Lora(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    assert m.models.frozen == []
    torch.manual_seed(0)
    for name, p in m.policy.named_parameters():
        if "lora_B" in name:  # PEFT starts B at 0 (adapter = identity); move it so the two differ
            p.data.normal_(0, 0.5)
    step = prepared(m, EASY[:2])
    base = load_policy(str(tiny_model_dir))  # loaded afresh: an independent reference
    with torch.no_grad():
        expected = m.update.scorer.logprobs(base, step.rollout)
        adapted = m.update.scorer.logprobs(m.policy, step.rollout)
    on = step.rollout.completion_mask.bool()
    assert torch.allclose(step.ref_logps[on], expected[on], atol=1e-5)
    assert not torch.allclose(adapted[on], expected[on], atol=1e-3)  # the adapter is on again afterwards


def test_only_the_adapter_trains(tiny_model_dir):
    m = _module(tiny_model_dir, Lora(r=4, alpha=8))
    trainable = {n for n, p in m.policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    optimized = {id(p) for g in m.configure_optimizers()["optimizer"].param_groups for p in g["params"]}
    assert optimized == {id(p) for n, p in m.policy.named_parameters() if n in trainable}


def test_lora_run_checkpoints_the_adapter_only_resumes_and_saves_adapter_and_merged(tmp_path):
    common = ["debug=fast", *TINY, "logger=csv", "rollout.filter.zero_std=false"]
    train_here(tmp_path / "full", common)
    train_here(tmp_path / "lora", [*common, "model/lora=on", "model.lora.r=4", "model.lora.merge_on_save=true"])
    full = tmp_path / "full" / "run" / "checkpoints" / "last.ckpt"
    lora = tmp_path / "lora" / "run" / "checkpoints" / "last.ckpt"
    state = torch.load(lora, map_location="cpu", weights_only=False)
    policy_keys = [k for k in state["state_dict"] if k.startswith("policy.")]
    assert policy_keys and all("lora_" in k for k in policy_keys)
    assert lora.stat().st_size < full.stat().st_size / 2
    # the optimizer state covers the adapter alone
    moments = [s["exp_avg"].numel() for s in state["optimizer_states"][0]["state"].values()]
    assert sum(moments) == sum(state["state_dict"][k].numel() for k in policy_keys)
    # resuming loads the adapter onto the reloaded base
    train_here(tmp_path / "resumed", [*common, "model/lora=on", "model.lora.r=4", f"ckpt_path={lora}",
                                      "trainer.max_steps=6"])
    out = tmp_path / "lora" / "run" / "policy"
    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    merged = load_policy(str(out / "merged"))
    from peft import PeftModel

    adapted = PeftModel.from_pretrained(load_policy(state["hyper_parameters"]["name_or_path"]), str(out))
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, adapted(ids).logits, atol=1e-4)


def test_a_full_checkpoint_cannot_resume_a_lora_run(tmp_path):
    common = ["debug=fast", *TINY, "logger=csv"]
    train_here(tmp_path / "full", common)
    full = tmp_path / "full" / "run" / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError, match="the checkpoint lacks .* adapter weights"):
        train_here(tmp_path / "b", [*common, "model/lora=on", f"ckpt_path={full}", "trainer.max_steps=6"])


@pytest.mark.parametrize("kwargs, message", [
    (dict(r=0), "model.lora.r must be >= 1, got 0"),
    (dict(dropout=1.0), r"model.lora.dropout must be in \[0, 1\), got 1.0"),
])
def test_bad_lora_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Lora(**kwargs)


def test_unknown_target_modules_are_named(tiny_model_dir):
    with pytest.raises(ValueError, match=r"model.lora.target_modules: \['c_attn'\] are not modules"):
        _module(tiny_model_dir, Lora(target_modules=["c_attn"]))
