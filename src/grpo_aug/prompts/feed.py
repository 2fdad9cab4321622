"""The prompt feed: picks the prompts a step rolls out from the curriculum's batch, and turns what
the rollout showed into the selector's training, the per-prompt history and the curriculum's
signal, identically on every rank.

    curriculum/weight/easy|medium|hard   the schedule's bucket weights for the step just trained
    curriculum/bucket                    the mean bucket of that step's groups (0 easy, 1 medium, 2 hard):
                                         the bucket it drew, unless data.mix_buckets
    curriculum/predicted_informative     1 - the selector's mean flat probability over the step's
                                         candidates (batch and spares; by bucket, weighted by the
                                         buckets' shares of the groups), once it is calibrated
    curriculum/moved/<from>_<to>         prompts the online difficulty moved, since the last write
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from grpo_aug.algo.group_stats import group_stats
from grpo_aug.data.prompt_format import PlainPrompt
from grpo_aug.data.records import BUCKETS, Prompt
from grpo_aug.distributed import gather_per_rank
from grpo_aug.prompts.curriculum import BucketStep
from grpo_aug.prompts.likelihood import reference_logprobs
from grpo_aug.prompts.selection import PromptSelection
from grpo_aug.step_types import Picked, SampledGroups


def bucket_totals(sampled: SampledGroups, flat_predicted: dict[str, float] | None) -> torch.Tensor:
    """Per bucket (rows in BUCKETS order): reward sum and count of the scored rows, groups with reward
    spread, groups with a defined std, groups, and the selector's predicted informative share and
    1 if it has one (summed over ranks, the last two give the mean over ranks)."""
    rewards, device = sampled.rewards, sampled.rewards.device
    stats = group_stats(rewards, sampled.valid)
    totals = torch.zeros(len(BUCKETS), 7, dtype=torch.float64, device=device)  # [3, 7]
    of = torch.tensor([BUCKETS.index(p.bucket) for p in sampled.prompts], device=device)  # [N]
    for k, bucket in enumerate(BUCKETS):
        mine = of == k  # [N]
        if not bool(mine.any()):
            continue
        scored = sampled.scored[mine]  # [n, G]
        has = stats.has_std[mine]  # [n]
        predicted = None if flat_predicted is None else flat_predicted.get(bucket)
        totals[k] = torch.tensor([
            torch.where(scored, rewards[mine].to(torch.float64), 0.0).sum().item(), float(scored.sum()),
            float((stats.informative[mine] & has).sum()), float(has.sum()), float(mine.sum()),
            0.0 if predicted is None else 1.0 - predicted, float(predicted is not None)], dtype=torch.float64)
    return totals


def seen_by_bucket(totals: torch.Tensor) -> dict[str, BucketStep]:
    """The schedule's view of a step from `bucket_totals` summed over ranks: each bucket that had groups."""
    groups = float(totals[:, 4].sum())
    seen = {}
    for k, bucket in enumerate(BUCKETS):
        reward_sum, scored, informative, has_std, n, predicted, ranks = totals[k].tolist()
        if n == 0:
            continue
        seen[bucket] = BucketStep(reward_sum / max(scored, 1.0), informative / has_std if has_std else 0.0,
                            predicted / ranks if ranks else None, n / groups)
    return seen


class PromptFeed:
    def __init__(self, selection: PromptSelection | None = None, schedule=None, total_steps: int = 0) -> None:
        """selection: prompts/selector (history, predictor, spares); schedule: the curriculum the
        DataModule draws its batches from, which learns from each step here (adaptive, bandit)."""
        self.selection = selection or PromptSelection()
        self.schedule = schedule
        self.total_steps = total_steps
        self.tokenizer = None
        self.prompt_format: Callable[..., list[str]] = PlainPrompt()
        self.max_tokens = 0
        self.ranks = None

    def bind(self, tokenizer, prompt_format: Callable[..., list[str]], max_tokens: int, ranks) -> None:
        """The run's tokenizer and prompt rendering, the rollout's token budget (references are cut
        to it) and the module's rank reductions."""
        self.tokenizer, self.prompt_format, self.max_tokens, self.ranks = tokenizer, prompt_format, max_tokens, ranks

    @property
    def history(self):
        return self.selection.history

    def pick(self, batch: list[Prompt], rollout_step: int, policy: torch.nn.Module) -> Picked:
        """The prompts to roll out: the selector skips those likely to give a flat group (replaced
        from the batch's buckets)."""
        def score(prompts: list[Prompt]) -> list[float]:  # log p(reference solution | prompt) under the policy now
            texts = self.prompt_format([p.prompt for p in prompts], [p.context for p in prompts])
            return reference_logprobs(policy, self.tokenizer, texts, [p.solution for p in prompts], self.max_tokens)

        return self.selection.pick(batch, rollout_step, score)

    def observe(self, picked: Picked, sampled: SampledGroups, rollout_step: int, rows_per_prompt: int
                ) -> dict[str, float]:
        """Every rank's outcomes update the history, the selector and the online buckets; the
        curriculum gets the rank-averaged reward and informative-group share. Returns the
        curriculum/* values of this step."""
        self.selection.observe(picked, sampled, rollout_step, rows_per_prompt, gather_per_rank)
        if self.schedule is None:
            return {}
        weights = self.schedule.weights(rollout_step, self.total_steps)
        values = {f"curriculum/weight/{b}": w for b, w in weights.items()}
        # pooled over ranks: an adaptive or bandit schedule must move the same way everywhere (with
        # mixed batches, each rank holds its own mix of the buckets)
        totals = self.ranks.reduce(bucket_totals(sampled, picked.flat_predicted), "sum")  # [3, 7]
        seen = seen_by_bucket(totals)
        self.schedule.observe(rollout_step, seen)
        predicted = [(s.share, s.predicted) for s in seen.values() if s.predicted is not None]
        if predicted and len(predicted) == len(seen):
            values["curriculum/predicted_informative"] = sum(w * p for w, p in predicted)
        values["curriculum/bucket"] = sum(BUCKETS.index(b) * s.share for b, s in seen.items())
        return values

    def window_metrics(self) -> dict[str, float]:
        """rollout/*, selector/* and curriculum/moved/* since the last call."""
        values = self.selection.window_metrics()
        values.update({f"curriculum/moved/{k}": float(v) for k, v in self.selection.history.moved.items()})
        return values

    def flat_rows_frac(self) -> float | None:
        return self.selection.flat_rows_frac()

    def state_dict(self) -> dict:
        return self.selection.state_dict()  # the same on every rank

    def load_state_dict(self, state: dict) -> None:
        self.selection.load_state_dict(state)
