"""Validated settings of the GRPO update (`algo`): clipping, KL, masks, updates per rollout."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from grpo_aug.algo.advantages import GroupScale
from grpo_aug.algo.aggregate import RowMean
from grpo_aug.algo.beta import ConstantBeta
from grpo_aug.algo.engine_correction import TokenTruncate
from grpo_aug.algo.kl import k3_kl
from grpo_aug.algo.loss import PolicyObjective
from grpo_aug.algo.masks import LossMask
from grpo_aug.algo.objectives import VESPO, Clipped
from grpo_aug.algo.ratio import SequenceRatio, TokenRatio
from grpo_aug.algo.winsorize import NoWinsorize
from grpo_aug.errors import UsageError


@dataclass(frozen=True)
class AlgoSettings:
    loss: Any = field(default_factory=RowMean)  # an aggregation variant from algo/loss
    beta: Any = field(default_factory=ConstantBeta)  # a KL-coefficient schedule from algo/beta
    kl: Any = k3_kl  # a KL estimator from algo/kl: (logps, ref_logps, bound) -> per-token KL
    kl_ratio_weighted: bool = False  # each token's KL times its importance ratio (TRL's use_bias_correction_kl)
    ratio: Any = field(default_factory=TokenRatio)  # the importance-ratio level from algo/ratio
    engine_correction: Any = field(default_factory=TokenTruncate)  # algo/engine_correction: external engines' rows
    surrogate: Any = field(default_factory=Clipped)  # the policy-gradient term from algo/surrogate
    top_entropy_quantile: float = 1.0  # the loss trains the tokens in the batch's top entropy share; 1.0: all
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    clip_ratio_c: float | None = None  # verl's dual clip for negative advantages (> 1); None = off
    entropy_coef: float = 0.0  # entropy bonus weight; 0 = off
    adv_clip: float = 10.0
    scale_rewards: Any = field(default_factory=GroupScale)  # algo/scale_rewards: group | batch | none
    winsorize: Any = field(default_factory=NoWinsorize)  # algo/winsorize: the step's rewards clipped to its quantiles
    num_iterations: int = 1  # mu: optimizer passes over each rollout
    minibatches: int = 1  # optimizer steps per pass, each on a slice of the groups
    max_grad_norm: float | None = 1.0
    length_chunks: int = 4  # when padding is wasteful, rows are grouped by length (attention or whole chunks)
    micro_batch_rows: int | None = None  # rows per forward/backward; gradients accumulate over them; None: all
    mask_truncated: bool = False
    template_patterns: tuple[str, ...] = ()  # regexes of scaffolding text that carries no loss
    repeat_ngram: int = 0  # token n-grams repeated more than repeat_max times carry no loss; 0 = off
    repeat_max: int = 3
    max_consecutive_nonfinite: int = 5  # skipped non-finite updates in a row before the run stops
    fast_llama: bool = True  # grpo_aug.fast_llama (decode loop, packed forward) where the model allows; false: HF only

    def __post_init__(self) -> None:
        if not callable(self.loss):
            raise UsageError(f"algo.loss must be a variant from the algo/loss group (algo/loss=row_mean|token_mean|"
                             f"constant_norm), got {self.loss!r}")
        if not hasattr(self.beta, "observe"):
            raise UsageError(f"algo.beta must be a schedule from the algo/beta group (algo/beta=constant|linear|"
                             f"relax, then e.g. algo.beta.value=0.04), got {self.beta!r}")
        checks = [
            (hasattr(self.scale_rewards, "divisor"),
             f"algo.scale_rewards must be a variant from the algo/scale_rewards group (algo/scale_rewards=group|batch|"
             f"none), got {self.scale_rewards!r}"),
            (callable(self.kl), f"algo.kl must be an estimator from the algo/kl group (algo/kl=k1|k2|k3), "
                                f"got {self.kl!r}"),
            (callable(self.ratio), f"algo.ratio must be a level from the algo/ratio group (algo/ratio=token|sequence), "
                                   f"got {self.ratio!r}"),
            (callable(self.engine_correction) and hasattr(self.engine_correction, "active"),
             f"algo.engine_correction must be a variant from the algo/engine_correction group (none|token_truncate|"
             f"token_mask|sequence_truncate|sequence_mask), got {self.engine_correction!r}"),
            (hasattr(self.surrogate, "name"),
             f"algo.surrogate must be a term from the algo/surrogate group (algo/surrogate=clipped|cispo|sapo|vespo), "
             f"got {self.surrogate!r}"),
            (not (isinstance(self.surrogate, VESPO) and isinstance(self.ratio, SequenceRatio)),
             "algo/surrogate=vespo weights each row by its own sequence ratio: use algo/ratio=token with it"),
            (not (isinstance(self.surrogate, VESPO) and getattr(self.engine_correction, "per_row", False)),
             f"algo/surrogate=vespo folds the engine correction's token weights into its row weight: use "
             f"algo/engine_correction=token_truncate or token_mask with it (as TRL 1.16), got "
             f"{type(self.engine_correction).__name__}"),
            (0 < self.top_entropy_quantile <= 1,
             f"algo.top_entropy_quantile must be in (0, 1], got {self.top_entropy_quantile}"),
            (self.clip_ratio_c is None or self.clip_ratio_c > 1,
             f"algo.clip_ratio_c must be > 1 or null, got {self.clip_ratio_c}"),
            (self.entropy_coef >= 0, f"algo.entropy_coef must be >= 0, got {self.entropy_coef}"),
            (0 <= self.clip_eps_low < 1, f"algo.clip_eps_low must be in [0, 1), got {self.clip_eps_low}"),
            (0 <= self.clip_eps_high < 1, f"algo.clip_eps_high must be in [0, 1), got {self.clip_eps_high}"),
            (self.adv_clip > 0, f"algo.adv_clip must be > 0, got {self.adv_clip}"),
            (self.num_iterations >= 1, f"algo.num_iterations must be >= 1, got {self.num_iterations}"),
            (self.minibatches >= 1, f"algo.minibatches must be >= 1, got {self.minibatches}"),
            (self.length_chunks >= 1, f"algo.length_chunks must be >= 1, got {self.length_chunks}"),
            (self.micro_batch_rows is None or self.micro_batch_rows >= 1,
             f"algo.micro_batch_rows must be >= 1 or null, got {self.micro_batch_rows}"),
            (self.max_grad_norm is None or self.max_grad_norm > 0,
             f"algo.max_grad_norm must be > 0 or null, got {self.max_grad_norm}"),
            (self.repeat_ngram >= 0, f"algo.repeat_ngram must be >= 0, got {self.repeat_ngram}"),
            (self.repeat_max >= 1, f"algo.repeat_max must be >= 1, got {self.repeat_max}"),
            (self.max_consecutive_nonfinite >= 1,
             f"algo.max_consecutive_nonfinite must be >= 1, got {self.max_consecutive_nonfinite}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        object.__setattr__(self, "template_patterns", tuple(self.template_patterns))
        for i, pattern in enumerate(self.template_patterns):
            try:
                re.compile(pattern)
            except re.error as err:
                raise UsageError(f"algo.template_patterns[{i}] = {pattern!r} is not a valid regex: {err}") from err

    @property
    def updates_per_rollout(self) -> int:
        return self.num_iterations * self.minibatches

    @property
    def needs_reference(self) -> bool:
        """False when beta is 0 at every step: no reference copy is held and none is run."""
        return not self.beta.always_zero

    @property
    def objective(self) -> PolicyObjective:
        """The clipped loss with these settings; beta and the aggregation come per update."""
        return PolicyObjective(self.clip_eps_low, self.clip_eps_high, self.kl, self.ratio, self.clip_ratio_c,
                                self.entropy_coef, None if isinstance(self.surrogate, Clipped) else self.surrogate,
                                self.kl_ratio_weighted)

    @property
    def loss_mask(self) -> LossMask:
        return LossMask(self.mask_truncated, tuple(re.compile(p) for p in self.template_patterns), self.repeat_ngram,
                        self.repeat_max)
