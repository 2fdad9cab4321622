import functools

import torch

from grpo_aug.algo.settings import LossSettings
from grpo_aug.callbacks import health_values
from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.models.module import GRPOModule
from grpo_aug.rewards import MathReward, RewardFunction
from grpo_aug.rollout.settings import RolloutSettings


def _module(path):
    m = GRPOModule(
        name_or_path=str(path),
        optimizer=functools.partial(torch.optim.AdamW, lr=1e-3),
        rewards=[RewardFunction(MathReward())],
        rollout=RolloutSettings(group_size=4, temperatures=(0.7, 1.5), top_p=0.95, max_new_tokens=6),
        algo=LossSettings(),
    )
    m.configure_model()
    return m


def test_reference_is_frozen_and_outside_optimizer_and_checkpoint(tiny_model_dir):
    m = _module(tiny_model_dir)
    ref = m.reference
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    optimized = {id(p) for g in m.configure_optimizers()["optimizer"].param_groups for p in g["params"]}
    assert optimized == {id(p) for p in m.policy.parameters()}
    assert not optimized & {id(p) for p in ref.parameters()}
    assert all(k.startswith(("policy.", "val_")) for k in m.state_dict())
    # the reference starts equal to the policy but is a separate copy
    p0, r0 = next(m.policy.parameters()), next(ref.parameters())
    assert torch.equal(p0, r0) and p0.data_ptr() != r0.data_ptr()


def test_training_step_gives_finite_loss_and_grads_only_to_policy(tiny_model_dir):
    torch.manual_seed(0)
    m = _module(tiny_model_dir)
    prompts = [r for r in SyntheticArithmetic(size_per_bucket=8, seed=0).load() if r.bucket == "easy"][:3]
    out = m.training_step(prompts, 0)
    assert torch.isfinite(out["loss"])
    assert out["rewards"].shape == (3, 4) and out["lengths"].shape == (12,)
    out["loss"].backward()
    assert any(p.grad is not None for p in m.policy.parameters())
    assert all(p.grad is None for p in m.reference.parameters())


def test_health_values_by_hand():
    outputs = {
        "rewards": torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]),
        "lengths": torch.tensor([4, 6, 2, 8, 5, 5, 5, 5]),
        "loss_tokens": torch.tensor(30.0),
        "kl_mean": torch.tensor(0.25),
        "distinct": torch.tensor([[True, True, False, True], [True, False, False, False]]),
        "valid": torch.tensor([[True, True, False, True], [False, False, False, False]]),
        "temperatures": torch.tensor([0.7, 1.5, 0.7, 1.5, 0.7, 1.5, 0.7, 1.5]),
    }
    v = {k: value.item() for k, (value, _) in health_values(outputs).items()}
    assert v["health/reward_mean"] == 5 / 8
    assert abs(v["health/reward_std"] - 0.25) < 1e-6  # groups' stds 0.5 and 0 -> mean 0.25
    assert v["health/effective_token_ratio"] == 30 / 40
    assert v["health/kl_mean"] == 0.25
    assert v["health/completion_length_mean"] == 5.0
    assert v["rollout/unique_ratio"] == 4 / 8
    assert v["rollout/groups_dropped_frac"] == 1 / 2
    assert v["rollout/zero_std_frac"] == 1 / 2  # the all-ones group
    assert v["rollout/reward_by_temperature/0.7"] == 3 / 4  # rows 0, 2 of group 0 and 1: 1, 0, 1, 1
    assert v["rollout/reward_by_temperature/1.5"] == 2 / 4  # rows 1, 3: 0, 0, 1, 1
