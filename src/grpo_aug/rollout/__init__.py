"""Stage 2 of a step, the group rollout (`GroupRollout`, groups.py): G rows per prompt from one
batched decode loop (or vLLM), per-row temperature and top-p; scored, deduplicated, down-sampled,
refilled; hints and reflection for all-wrong groups."""

from grpo_aug.rollout.groups import GroupRollout, SampledGroups
from grpo_aug.rollout.sampling import generate, sample_next_token
from grpo_aug.rollout.types import Rollout

__all__ = ["GroupRollout", "Rollout", "SampledGroups", "generate", "sample_next_token"]
