"""The policy update's scoring: token log-probs of rollout rows under a model (the reference, the
rollout policy, the policy), whole, in length chunks or in micro-batches."""
