"""Pure tensor functions of the GRPO update: advantages, KL estimators, ratios, aggregation, the
clipped loss, masks, length chunks. Nothing here runs a model or imports another grpo_aug package
but `mathtext`: what runs models to score rows lives in `grpo_aug.update`."""

from grpo_aug.algo.advantages import group_advantages
from grpo_aug.algo.kl import k3_kl
from grpo_aug.algo.loss import LOG_RATIO_BOUND, policy_loss

__all__ = [
    "LOG_RATIO_BOUND",
    "group_advantages",
    "k3_kl",
    "policy_loss",
]
