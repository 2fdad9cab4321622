"""Pure tensor functions of the GRPO update: advantages, KL estimators, the clipped loss.

Token log-probs live in `grpo_aug.algo.logprobs` (not re-exported: it runs models through
`grpo_aug.lean`, which itself uses `grpo_aug.algo.chunks`)."""

from grpo_aug.algo.advantages import group_advantages
from grpo_aug.algo.kl import k3_kl
from grpo_aug.algo.loss import LOG_RATIO_BOUND, policy_loss

__all__ = [
    "LOG_RATIO_BOUND",
    "group_advantages",
    "k3_kl",
    "policy_loss",
]
