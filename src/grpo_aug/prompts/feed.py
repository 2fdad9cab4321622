"""The prompt feed: picks the prompts a step rolls out from the curriculum's batch, and turns what
the rollout showed into the selector's training, the per-prompt history and the curriculum's
signal, identically on every rank.

    curriculum/weight/easy|medium|hard   the schedule's bucket weights for the step just trained
    curriculum/bucket                    the bucket that step drew (0 easy, 1 medium, 2 hard)
    curriculum/predicted_informative     1 - the selector's mean flat probability over the step's
                                         candidates (batch and spares), once it is calibrated
    curriculum/moved/<from>_<to>         prompts the online difficulty moved, since the last write
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from grpo_aug.algo.group_stats import counted_mean, informative_share
from grpo_aug.data.prompt_format import PlainPrompt
from grpo_aug.data.records import BUCKETS, Prompt
from grpo_aug.distributed import gather_per_rank
from grpo_aug.prompts.likelihood import reference_logprobs
from grpo_aug.prompts.selection import Picked, PromptSelection
from grpo_aug.rollout.groups import SampledGroups


class PromptFeed:
    def __init__(self, selection: PromptSelection | None = None, schedule=None, total_steps: int = 0) -> None:
        """selection: rollout/selector (history, predictor, spares); schedule: the curriculum the
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
        from the same bucket)."""
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
        bucket = sampled.prompts[0].bucket
        # averaged over ranks: an adaptive or bandit schedule must move the same way everywhere; the
        # predictor's state (calibrated or not) is the same on every rank
        predicted = float("nan") if picked.flat_predicted is None else 1.0 - picked.flat_predicted
        signal = torch.stack([counted_mean(sampled.rewards, sampled.scored).float(),
                              informative_share(sampled.rewards, sampled.valid).float(),
                              torch.tensor(predicted, device=sampled.rewards.device)])  # [3]
        reward, informative, predicted = self.ranks.reduce(signal, "mean").tolist()
        self.schedule.observe(rollout_step, bucket, reward, informative,
                              predicted=None if math.isnan(predicted) else predicted)
        if not math.isnan(predicted):
            values["curriculum/predicted_informative"] = predicted
        values["curriculum/bucket"] = float(BUCKETS.index(bucket))
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
