"""The per-prompt rollout budget (rollout/budget=informative): row counts worked out by hand,
groups of different sizes laid out with absent slots, and their statistics, advantages, rewards
and update rows against plain Python computations."""

import math
import statistics

import pytest
import torch

from grpo_aug.algo import group_advantages
from grpo_aug.algo.group_stats import group_stats
from grpo_aug.data.records import Prompt
from grpo_aug.engines.rows import spread_rows
from grpo_aug.engines.types import rollout_from_ids
from grpo_aug.prompts.history import Outcome, PromptHistory
from grpo_aug.rewards import RewardFunction, RewardSet
from grpo_aug.rollout.budget import InformativeBudget, allocate, spread_probability
from grpo_aug.rollout.dedup import NgramDedup
from grpo_aug.rollout.filter import GroupFilter
from grpo_aug.rollout.settings import RolloutSettings
from grpo_aug.update.policy_update import OptimizerHandle
from helpers import make_module, prepared


def _prompt(i, bucket="easy", answer="4"):
    return Prompt(f"p{i}", f"What is {i}?", f"Q: What is {i}?\nA: ", answer, f"#### {answer}", bucket)


def test_spread_probability_by_hand():
    assert spread_probability(0.5, 2) == pytest.approx(0.5)  # 1 - 1/4 - 1/4
    assert spread_probability(0.1, 3) == pytest.approx(1 - 0.001 - 0.729)
    assert spread_probability(0.0, 8) == 0.0 and spread_probability(1.0, 8) == 0.0


def test_rows_go_where_they_most_raise_the_chance_of_spread():
    # min 2 each, 8 more rows for 4 prompts. Gains of one more row: p = 0.5: 0.25, 0.125, 0.0625,
    # 0.03125 (2->3, 3->4, ...); p = 0.1: 0.09, 0.0738, 0.0657, 0.0591, 0.0531; p = 0 and 1: 0.
    # In order: 0.5 (3), 0.5 (4), 0.1 (3), 0.1 (4), 0.1 (5), 0.5 (5), 0.1 (6), 0.1 (7).
    assert allocate([0.0, 0.5, 0.1, 1.0], total=16, min_rows=2, max_rows=8) == [2, 5, 7, 2]
    # the cap binds: max_rows each even if the total is larger
    assert allocate([0.5, 0.5], total=20, min_rows=2, max_rows=8) == [8, 8]
    # equal prompts share equally (ties go to the prompt with fewer rows, then the earlier one)
    assert allocate([0.3, 0.3, 0.3], total=10, min_rows=2, max_rows=8) == [4, 3, 3]
    # nothing to gain anywhere (never or always right): an even split, not all to the first
    assert allocate([0.0, 1.0, 0.0], total=12, min_rows=2, max_rows=8) == [4, 4, 4]


def test_pass_rates_come_from_the_history_then_the_bucket_then_the_prior():
    history = PromptHistory()
    history.start({"p1": "easy", "p2": "easy", "p3": "easy", "p4": "hard"})
    history.observe(0, [Outcome("p1", 0.8, False, "easy"), Outcome("p2", 0.4, False, "easy")])
    budget = InformativeBudget(min_rows=2, max_rows=8, prior=0.3)
    rates = history.predicted_pass([_prompt(1), _prompt(3), _prompt(4, "hard"), _prompt(2)], budget.prior)
    assert rates == pytest.approx([0.8, 0.6, 0.3, 0.4])  # own, easy's mean (0.8 + 0.4) / 2, prior, own
    assert budget.rows(rates[:2], group_size=4) == allocate([0.8, 0.6], 8, 2, 8)


@pytest.mark.parametrize("kwargs, settings, message", [
    (dict(min_rows=1), {}, "rollout.budget.min_rows must be >= 2"),
    (dict(min_rows=6, max_rows=4), {}, "rollout.budget.max_rows=4 is below rollout.budget.min_rows=6"),
    (dict(prior=1.5), {}, "rollout.budget.prior must be in"),
    (dict(min_rows=2, max_rows=6), dict(group_size=8), "rollout.group_size=8 must lie within"),
    (dict(min_rows=2, max_rows=16), dict(oversample=2), "does not combine with rollout.oversample=2"),
    (dict(min_rows=2, max_rows=16), dict(dedup=NgramDedup(min_unique=4)), "rollout.dedup.min_unique=4 exceeds"),
])
def test_bad_budget_settings_are_named(kwargs, settings, message):
    with pytest.raises(ValueError, match=message):
        RolloutSettings(budget=InformativeBudget(**kwargs), **settings)


def test_groups_of_different_sizes_are_laid_out_with_absent_slots():
    # group 0 has 1 row, group 1 has 3: width 3 -> slots [r0, -, -, r1, r2, r3]
    ro = rollout_from_ids([[1]] * 4, [[5, 9], [6, 9], [7, 7], [8, 9]], [[-1.0, -1.0]] * 4,
                          torch.tensor([0.7, 0.7, 1.0, 1.2]), ["a", "b", "c", "d"], [True, True, False, True], 0)
    out, present = spread_rows(ro, [1, 3], 3)
    assert present.tolist() == [[True, False, False], [True, True, True]]
    assert out.texts == ["a", "", "", "b", "c", "d"]
    assert out.completion_mask.sum(dim=1).tolist() == [2, 0, 0, 2, 2, 2]
    assert out.input_ids[3:, out.prompt_len :].tolist() == [[6, 9], [7, 7], [8, 9]]
    assert out.attention_mask[1].tolist() == [1, 0, 0]  # the prompt only: no completion to attend to
    assert out.temperatures.tolist() == pytest.approx([0.7, 0.7, 0.7, 0.7, 1.0, 1.2])


def test_rewards_of_groups_of_different_sizes_leave_missing_rows_unscored():
    calls = []

    def reward(prompt, text):
        calls.append(text)
        return float(len(text))

    scores = RewardSet([RewardFunction(reward)]).score([_prompt(1), _prompt(2)], [["ab"], ["a", "abc", ""]])
    assert calls == ["ab", "a", "abc", ""]  # the functions see the rows that exist, nothing else
    assert scores.total.tolist() == [[2.0, 0.0, 0.0], [1.0, 3.0, 0.0]]
    assert scores.scored.tolist() == [[True, False, False], [True, True, True]]
    part = scores.parts[RewardFunction(reward).name]
    assert math.isnan(part[0, 1]) and part[1, 2] == 0.0


def test_statistics_and_advantages_of_groups_of_different_sizes_match_plain_python():
    groups = [[1.0, 0.0], [0.0, 0.0, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5]]
    width = 5
    rewards = torch.tensor([g + [0.0] * (width - len(g)) for g in groups])  # [3, 5]
    present = torch.tensor([[i < len(g) for i in range(width)] for g in groups])  # [3, 5]
    stats = group_stats(rewards, present)
    adv = group_advantages(rewards, present)  # [3, 5]
    for b, g in enumerate(groups):
        assert stats.count[b] == len(g)
        assert stats.mean[b].item() == pytest.approx(statistics.fmean(g))
        flat = len(set(g)) == 1
        assert stats.std[b].item() == pytest.approx(0.0 if flat else statistics.stdev(g))
        expected = [0.0] * len(g) if flat else [(r - statistics.fmean(g)) / (statistics.stdev(g) + 1e-6) for r in g]
        assert adv[b, : len(g)].tolist() == pytest.approx(expected, abs=1e-5)
        assert adv[b, len(g) :].abs().sum() == 0


class RightIfEven:
    """Row k of the step (in sampling order) is right when k is even: spread in every group of 2+."""

    def __init__(self):
        self.k = 0

    def __call__(self, prompt, text):
        self.k += 1
        return float(self.k % 2 == 1)


def test_a_budgeted_step_rolls_out_scores_and_updates_only_the_rows_it_allotted(tiny_model_dir):
    settings = RolloutSettings(group_size=4, temperatures=(1.0,), top_p=1.0, max_new_tokens=6,
                               filter=GroupFilter(zero_std=True), budget=InformativeBudget(min_rows=2, max_rows=6))
    m = make_module(tiny_model_dir, RightIfEven(), settings)
    m.configure_model()
    history = m.feed.history
    history.start({"p1": "easy", "p2": "easy", "p3": "easy"})
    # p1 near-certain, p2 at 0.5, p3 rarely right: min 2 each, 6 more by gain: p=0.5 0.25, 0.125,
    # 0.0625; p=0.1 0.09, 0.0738, 0.0657; p=0.98 0.0196 -> rows [2, 5, 5]
    history.observe(0, [Outcome("p1", 0.98, True, "easy"), Outcome("p2", 0.5, False, "easy"),
                        Outcome("p3", 0.1, False, "easy")])
    batch = [_prompt(1), _prompt(2), _prompt(3)]
    assert settings.budget.rows(history.predicted_pass(batch, settings.budget.prior), 4) == [2, 5, 5]
    step = prepared(m, batch)
    sampled = step.sampled
    assert sampled.rows_present.sum(dim=1).tolist() == [2, 5, 5]
    assert sampled.rewards.shape == (3, 6) and len(sampled.rollout.texts) == 18
    # rewards alternate 1, 0 in sampling order over the 12 rows that exist; absent slots are 0 and unscored
    expected = [[1, 0, 0, 0, 0, 0], [1, 0, 1, 0, 1, 0], [0, 1, 0, 1, 0, 0]]
    assert sampled.rewards.tolist() == expected
    assert (sampled.valid == sampled.rows_present).all()
    # every group has spread: all 12 rows enter the update, each group's rows at its own span
    assert step.rollout.input_ids.shape[0] == 12
    assert [step.rows_of(torch.tensor([b])).tolist() for b in range(3)] == [[0, 1], [2, 3, 4, 5, 6], list(range(7, 12))]
    assert step.rows_of(torch.tensor([2, 0])).tolist() == [7, 8, 9, 10, 11, 0, 1]
    for b, (lo, hi) in enumerate([(0, 2), (2, 7), (7, 12)]):
        g = [float(x) for x in expected[b][: hi - lo]]
        mean, std = statistics.fmean(g), statistics.stdev(g)
        assert step.advantages[lo:hi].tolist() == pytest.approx([(r - mean) / (std + 1e-6) for r in g], abs=1e-5)
    assert step.mask.sum() == step.rollout.completion_mask.sum()  # nothing absent carries loss
    # one real update over groups of 2, 4 and 6 rows: the loss counts the 12 rows, nothing else
    optimizer = torch.optim.SGD(m.policy.parameters(), lr=0.0)
    handle = OptimizerHandle(optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
                             lambda loss: loss.backward(), 0)
    updates, _, _ = m.update.train(m.policy, step, handle)
    assert torch.isfinite(updates.loss).all() and updates.skipped.sum() == 0


def test_a_run_with_the_budget_trains_and_logs(tmp_path):
    from helpers import TINY, all_finite, read_events, read_scalars, train_here

    train_here(tmp_path, ["debug=fast", *TINY, "rollout/budget=informative", "rollout.budget.min_rows=2",
                          "rollout.budget.max_rows=6", "rollout.group_size=4", "rollout.filter.zero_std=false"])
    scalars = read_scalars(tmp_path / "run")
    assert all_finite(scalars["train/loss"]) and all_finite(scalars["health/completion_length_mean"])
    assert "distributions/group_rows" in read_events(tmp_path / "run")["histograms"]
