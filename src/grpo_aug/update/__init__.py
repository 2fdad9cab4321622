"""Stage 3 of a step, the policy update (`PolicyUpdate`, policy_update.py): masks, advantages,
reference and rollout-policy log-probs (scoring: whole, in length chunks or micro-batches), the
clipped loss per chunk, and the optimizer steps with the non-finite skip."""

from grpo_aug.update.policy_update import PolicyUpdate

__all__ = ["PolicyUpdate"]
