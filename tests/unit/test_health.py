"""Health metrics by hand, the callback's windows, per-bucket curves and distributions."""

from types import SimpleNamespace

import pytest
import torch

from grpo_aug.callbacks import SampleHealth, health_values
from grpo_aug.callbacks.health import length_stats, samples_markdown
from helpers import Recorder, make_report


def test_health_values_by_hand():
    outputs = make_report(
        [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 5.0, 0.0, 5.0]],
        [0.7, 1.5] * 6,
        lengths=torch.tensor([4, 6, 2, 8, 5, 5, 5, 5, 1, 1, 1, 1]),
        loss_tokens=torch.tensor(30.0),
        generated_tokens=torch.tensor(40.0),  # by the rows that entered the update
        kl_mean=torch.tensor(0.25),
        distinct=torch.tensor([[True, True, False, True], [True, False, False, False], [True] * 4]),
        valid=torch.tensor([[True, True, False, True], [False] * 4, [True] * 4]),
        truncated=torch.tensor([True] + [False] * 11),
        advantages=torch.tensor([1.5, -0.5, -0.5, 0.0, 0.5]),
        refill_rounds=torch.tensor(2.0),
        refill_exhausted=torch.tensor(1.0),
        junk_chars=torch.tensor(3.0),
        completion_chars=torch.tensor(60.0),
    )
    v = {k: value.item() for k, (value, _) in health_values(outputs).items()}
    assert v["health/junk_frac"] == pytest.approx(3 / 60)
    assert v["health/reward_mean"] == pytest.approx(15 / 12)
    # group stds (unbiased): {1,0,0,0} -> 0.5; all ones -> 0; {0,5,0,5} -> sqrt(25/3) = 2.887
    assert v["health/reward_std"] == pytest.approx((0.5 + 0 + (25 / 3) ** 0.5) / 3, rel=1e-5)
    assert v["health/group_std_low_frac"] == pytest.approx(1 / 3)  # only the flat group is below 0.3
    assert v["health/group_std_high_frac"] == pytest.approx(1 / 3)  # the 0/5 group is above 2.0
    assert v["health/zero_std_frac"] == v["rollout/zero_std_frac"] == pytest.approx(1 / 3)
    assert v["health/effective_token_ratio"] == pytest.approx(30 / 40)
    assert v["health/kl_mean"] == 0.25 and v["health/entropy_mean"] == 1.0
    assert v["health/adv_abs_mean"] == pytest.approx(3.0 / 5)
    assert v["health/truncation_rate"] == pytest.approx(1 / 12)
    assert v["health/completion_length_mean"] == pytest.approx(44 / 12)
    assert v["rollout/unique_ratio"] == pytest.approx(8 / 12)
    assert v["rollout/groups_dropped_frac"] == pytest.approx(1 / 3)
    assert v["rollout/reward_by_temperature/0.7"] == pytest.approx((1 + 0 + 1 + 1 + 0 + 0) / 6)
    assert v["rollout/reward_by_temperature/1.5"] == pytest.approx((0 + 0 + 1 + 1 + 5 + 5) / 6)
    assert (v["rollout/refill_rounds"], v["rollout/refill_exhausted"]) == (2.0, 1.0)


def test_length_quantiles_and_polarisation_by_hand():
    # 11 lengths 0..100 step 10: p10 = 10, p50 = 50, p90 = 90 (linear interpolation on exact points)
    stats = length_stats(torch.arange(0, 101, 10))
    assert stats["health/completion_length_p10"] == pytest.approx(10)
    assert stats["health/completion_length_p50"] == pytest.approx(50)
    assert stats["health/completion_length_p90"] == pytest.approx(90)
    assert stats["health/length_polarisation"] == pytest.approx(9.0)
    assert length_stats(torch.tensor([0.0, 0.0, 0.0]))["health/length_polarisation"] == 0.0


def test_callback_logs_weighted_means_per_interval_buckets_and_vanished_rungs():
    rec = Recorder()
    cb = SampleHealth(every_n_steps=2, bucket_every_n_steps=4)
    module = SimpleNamespace(device=torch.device("cpu"))
    easy, hard = [SimpleNamespace(bucket="easy")], [SimpleNamespace(bucket="hard")]
    steps = [([[1.0, 0.0]], [0.7, 1.5], easy, 0.1), ([[1.0, 1.0], [0.0, 0.0]], [0.7, 1.5, 0.7, 1.5], easy, 0.7),
             ([[1.0, 0.0]], [0.7, 1.0], hard, 0.2), ([[0.0, 0.0]], [0.7, 1.0], hard, 0.3)]
    for step, (rewards, temps, batch, kl_max) in enumerate(steps, start=1):
        trainer = SimpleNamespace(global_step=step, loggers=[rec], is_global_zero=True)
        report = make_report(rewards, temps, kl_max=torch.tensor(kl_max), buckets=(batch[0].bucket,) * len(rewards))
        cb.on_train_batch_end(trainer, module, {"report": report}, batch, 0)
    (s2, first), (s4, second) = rec.logged
    # steps 1-2: 6 rewards, 3 ones -> 0.5 (weighted by rows, not a mean of step means 0.5, 0.5)
    assert (s2, first["health/reward_mean"]) == (2, 0.5)
    assert first["rollout/reward_by_temperature/0.7"] == pytest.approx(2 / 3)
    assert first["rollout/reward_by_temperature/1.5"] == pytest.approx(1 / 3)
    assert first["health/kl_max"] == pytest.approx(0.7) and second["health/kl_max"] == pytest.approx(0.3)
    assert first["health/completion_length_p50"] == 4.0
    # steps 3-4: rung 1.5 was not sampled, so it is not logged (no NaN); rung 1.0 appears
    assert s4 == 4 and "rollout/reward_by_temperature/1.5" not in second
    assert second["rollout/reward_by_temperature/0.7"] == 0.5 and second["rollout/reward_by_temperature/1"] == 0.0
    # per bucket, only at step 4: easy steps 1-2 had 3 ones in 6 rewards, hard steps 3-4 1 in 4
    assert "health/reward_mean/easy" not in first
    assert second["health/reward_mean/easy"] == 0.5 and second["health/reward_mean/hard"] == 0.25
    assert "health/reward_mean/medium" not in second  # no medium group: no point, not a 0


def test_a_mixed_step_splits_its_rewards_by_bucket():
    rec = Recorder()
    cb = SampleHealth(every_n_steps=1, bucket_every_n_steps=1)
    module = SimpleNamespace(device=torch.device("cpu"))
    trainer = SimpleNamespace(global_step=1, loggers=[rec], is_global_zero=True)
    # groups: easy 1, 1 | hard 1, 0 | easy 0, 1 -> easy 3 of 4, hard 1 of 2, no medium
    report = make_report([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]], buckets=("easy", "hard", "easy"))
    cb.on_train_batch_end(trainer, module, {"report": report}, [], 0)
    (_, logged), = rec.logged
    assert logged["health/reward_mean/easy"] == 0.75 and logged["health/reward_mean/hard"] == 0.5
    assert "health/reward_mean/medium" not in logged and logged["health/reward_mean"] == pytest.approx(4 / 6)


def test_samples_markdown_escapes_cells():
    md = samples_markdown([{"prompt": "Q: 1|2\nA: ", "completion": "x" * 400, "temperature": 0.7, "reward": 1.0,
                            "advantage": -0.5}])
    assert "Q: 1\\|2<br>A: " in md and "..." in md and "| 0.7 | 1.000 | -0.500 |" in md


def test_unscorable_rows_are_not_zero_rewards_and_flat_means_counted_rows():
    # group 1: rows 3-4 unscorable (stored as 0); counted 1.0, 0.0 -> std sqrt(0.5)
    # group 2: counted 0.3 x 3 and one near-copy (not counted) of reward 0.8: flat, std 0
    outputs = make_report([[1.0, 0.0, 0.0, 0.0], [0.3, 0.3, 0.3, 0.8]], [1.0] * 8,
                       scored=torch.tensor([[True, True, False, False], [True] * 4]),
                       counted=torch.tensor([[True, True, False, False], [True, True, True, False]]))
    v = {k: value.item() for k, (value, _) in health_values(outputs).items()}
    assert v["health/reward_mean"] == pytest.approx((1.0 + 0.3 * 3 + 0.8) / 6)
    assert v["health/reward_std"] == pytest.approx(0.5**0.5 / 2)
    assert v["health/zero_std_frac"] == 0.5 and v["health/group_std_low_frac"] == 0.5


def test_window_without_loss_tokens_writes_no_token_weighted_point():
    rec = Recorder()
    cb = SampleHealth(every_n_steps=1, bucket_every_n_steps=1)
    module = SimpleNamespace(device=torch.device("cpu"))
    trainer = SimpleNamespace(global_step=1, loggers=[rec], is_global_zero=True)
    # every group filtered out: no loss token, no advantage; the loss stats are 0/0 placeholders
    outputs = make_report([[1.0, 1.0]], [1.0, 1.0], loss_tokens=torch.tensor(0.0), kl_mean=torch.tensor(float("nan")),
                       entropy_mean=torch.tensor(float("nan")), clip_frac=torch.tensor(float("nan")),
                       advantages=torch.zeros(0))
    cb.on_train_batch_end(trainer, module, {"report": outputs}, [SimpleNamespace(bucket="easy")], 0)
    (_, logged), = rec.logged
    for name in ("kl_mean", "kl_max", "entropy_mean", "clip_frac", "clip_frac_low", "adv_abs_mean"):
        assert f"health/{name}" not in logged, name
    assert logged["health/reward_mean"] == 1.0 and logged["health/zero_std_frac"] == 1.0
    assert all(v == v for v in logged.values())  # no NaN anywhere


def test_every_rung_of_the_ladder_is_named_even_where_a_group_kept_none():
    # max-variance down-sampling kept rungs 0.7/1.0 in group 0 and 1.5/1.5 in group 1: every rank
    # must still update the same names, so the names come from the ladder, not from the rows
    report = make_report([[1.0, 0.0], [0.0, 1.0]], [0.7, 1.0, 1.5, 1.5], ladder=(0.7, 1.0, 1.5))
    values = health_values(report)
    names = {k for k in values if k.startswith("rollout/reward_by_temperature/")}
    assert names == {f"rollout/reward_by_temperature/{t}" for t in ("0.7", "1", "1.5")}
    value, weight = values["rollout/reward_by_temperature/1.5"]
    assert (value.item(), weight.item()) == (0.5, 2.0)
    lonely = health_values(make_report([[1.0, 0.0]], [0.7, 0.7], ladder=(0.7, 1.0)))
    assert lonely["rollout/reward_by_temperature/1"][1].item() == 0  # weight 0: no point written
