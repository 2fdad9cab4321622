"""Stage 1 of a step, the prompt feed: which prompts a step rolls out and what their groups
showed. The curriculum's batches (datamodule, batch sampler, schedules), the per-prompt history,
the flat-group predictors and the selection that reads them, the policy's likelihood of each
reference, pass-rate tiers; `PromptFeed` ties them into one object with one state."""

from grpo_aug.prompts.feed import PromptFeed

__all__ = ["PromptFeed"]
