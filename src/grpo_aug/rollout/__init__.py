"""Stage 2 of a step, the group rollout (`GroupRollout`, groups.py): G rows per prompt from an
engine (engines/), per-row temperature and top-p; scored, deduplicated, down-sampled, refilled;
hints and reflection for all-wrong groups."""

from grpo_aug.rollout.groups import GroupRollout

__all__ = ["GroupRollout"]
