"""The contracts between the three stages of a GRPO step, in the order the step makes them:

    prompts/  picks the prompts to roll out           -> Picked
    rollout/  samples and scores their groups         -> SampledGroups
    update/   prepares what the updates need          -> PreparedStep
              trains on it, chunk by chunk            -> ChunkStats, then UpdateStats per update

The stages import these types, not each other (tests/test_layering.py checks it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from grpo_aug.algo.loss import LossStats
from grpo_aug.data.records import Prompt
from grpo_aug.engines.types import Rollout

PromptPool = Callable[..., list[Prompt]]  # (bucket, n, step, round, used ids, purpose=...) -> prompts


class Picked(NamedTuple):
    """Stage 1 (prompts/feed.py): the prompts to roll out this step, and how they were chosen."""

    prompts: list[Prompt]  # to roll out
    audited: frozenset[str]  # ids rolled out although the selector would have skipped them
    skipped: int  # candidates skipped
    considered: int  # candidates screened (the batch and its replacements)
    references: dict[str, float]  # prompt id -> log p(reference solution); empty when the selector does not read it
    # per bucket, the mean predicted flat probability of its candidates drawn (batch and spares);
    # None: the predictor is not a calibrated probability yet (or there is none)
    flat_predicted: dict[str, float] | None = None
    rows: list[int] | None = None  # [len(prompts)] rows to roll out per prompt (rollout/budget); None: group_size each


class SampledGroups(NamedTuple):
    """Stage 2 (rollout/groups.py): n groups of G rows, scored; refill rounds included."""

    prompts: list[Prompt]
    rollout: Rollout  # [n*G] rows
    rewards: torch.Tensor  # [n, G] total reward, overlong shaping included; 0 where unscorable
    parts: dict[str, torch.Tensor]  # per reward function, [n, G], NaN where unscorable
    errors: dict[str, int]  # per reward function, calls that raised (reward.on_error=skip)
    timeouts: dict[str, int]  # per reward function, calls past reward.timeout_s
    distinct: torch.Tensor  # [n, G]
    scored: torch.Tensor  # [n, G] every reward function returned a number
    valid: torch.Tensor  # [n, G] scored, passed every reward filter, not a near-copy, group kept
    informative: torch.Tensor  # [n] groups whose counted rewards differ
    kept: torch.Tensor  # [n] groups that enter the update: the informative ones under rollout.filter.zero_std, else all
    std_gain: torch.Tensor  # [n] float64, group std kept minus that of the first G rows (0 without oversampling)
    tokens: int  # tokens generated, rows dropped by down-sampling included
    rounds: int = 1  # rollout rounds that made these groups (1 + refill rounds)
    refill_exhausted: bool = False  # the refill (rollout.filter.refill) ended short of one informative group per prompt
    external: bool = False  # an engine outside the trainer (vLLM) sampled the rows: its log-probs carry its kernels'
    hinted: torch.Tensor | None = None  # [n, G] rows re-sampled with a hint in the question (rollout/reflect=hint),
                                        # trained off-policy; None: off
    reflected: torch.Tensor | None = None  # [n, G] rows re-sampled for all-wrong groups (hint or reference
                                           # prefix); None: rollout/reflect=none
    present: torch.Tensor | None = None  # [n, G] rows that exist: a per-prompt budget (rollout/budget)
                                         # leaves groups short of G slots; None: every row
    versions: torch.Tensor | None = None  # [n, G] long, the policy version (rollout steps trained) that sampled
                                          # each row (rollout.ahead >= 1); None: the policy as it is now

    @property
    def rows_present(self) -> torch.Tensor:
        """[n, G] bool: the rows that exist (all, unless a per-prompt budget sized the groups)."""
        return torch.ones_like(self.valid) if self.present is None else self.present


class PreparedStep(NamedTuple):
    """Stage 3 (update/policy_update.py): the groups that enter the update, with their advantages
    and the log-probs the loss compares against."""

    sampled: SampledGroups  # [N] groups: everything that was rolled out this step, refills included
    groups: torch.Tensor  # [B] the groups that enter the update (all N unless the zero-std filter is on)
    valid: torch.Tensor  # [N, G] counted rows of the groups in the update
    rollout: Rollout  # [B*G] rows of the groups in the update
    mask: torch.Tensor  # [B*G, T] tokens that carry loss
    advantages: torch.Tensor  # [B*G]
    ref_logps: torch.Tensor | None  # [B*G, T]; None when no group entered the update
    old_logps: torch.Tensor | None  # [B*G, T] rollout policy; None when it is the policy itself (mu = 1)
    refill_exhausted: bool  # the refill ended short of data.batch_size informative groups
    hinted: torch.Tensor | None = None  # [B*G] rows sampled under a hinted prompt (rollout/reflect); None: off
    engine_sampled: bool = False  # an external engine (vLLM) sampled the rows: its log-probs get corrected
    stand_in: bool = False  # no group entered: `rollout` is one stand-in row without loss (update/lockstep.py)

    @property
    def generated_tokens(self) -> torch.Tensor:
        """[] tokens the policy generated in the rows that entered the update (none for a stand-in;
        a tool's output or a reference prefix is not generated)."""
        return self.rollout.written.sum() * (not self.stand_in)

    @property
    def update_advantages(self) -> torch.Tensor:
        """[B*G] the advantages of the rows that entered the update (none for a stand-in)."""
        return self.advantages[: 0 if self.stand_in else len(self.advantages)]

    def rows_of(self, groups: torch.Tensor) -> torch.Tensor:
        """Row indices into `rollout` of the update's groups `groups` ([b] positions in `groups`):
        its rows are the groups' existing rows, group after group (G each without a budget)."""
        sizes = self.sampled.rows_present[self.groups].sum(dim=1).cpu()  # [B]
        ends = sizes.cumsum(0)  # [B]
        return torch.cat([torch.arange(int(ends[i] - sizes[i]), int(ends[i])) for i in groups.tolist()] or
                         [torch.zeros(0, dtype=torch.long)])


class ChunkStats(NamedTuple):
    """One chunk's statistics (update/chunk_loss.py), detached, each []; None: not measured on
    this chunk (entropy on the rollout's first update only, the engine ratio when an engine sampled)."""

    loss: LossStats
    tokens: torch.Tensor  # the chunk's loss tokens: the weight of its means when chunks merge
    entropy: torch.Tensor | None = None
    logprob_gap: torch.Tensor | None = None  # mean |log pi_sampler - log pi_trainer| per loss token
    is_ratio_mean: torch.Tensor | None = None  # the engine correction's pi_trainer / pi_engine, before its cap
    is_ratio_max: torch.Tensor | None = None
    is_masked_frac: torch.Tensor | None = None  # loss tokens the correction masked
    entropy_kept: torch.Tensor | None = None  # loss tokens inside algo.top_entropy_quantile's mask


class UpdateStats(NamedTuple):
    """One optimizer update's statistics, each [] (its chunks merged: token-weighted means, maxima
    for *_max; 0 where no chunk measured it); `stack` makes the step's [U] of each."""

    loss: torch.Tensor  # the global batch's loss
    nonfinite: torch.Tensor  # chunks with a non-finite loss on this rank
    skipped: torch.Tensor  # 1: the update was skipped on every rank (non-finite loss or gradient)
    kl_mean: torch.Tensor
    kl_max: torch.Tensor
    clip_frac_low: torch.Tensor
    clip_frac_high: torch.Tensor
    clip_frac: torch.Tensor
    clip_frac_dual: torch.Tensor
    ratio_mean: torch.Tensor
    ratio_max: torch.Tensor
    entropy: torch.Tensor
    logprob_gap: torch.Tensor
    is_ratio_mean: torch.Tensor
    is_ratio_max: torch.Tensor
    is_masked_frac: torch.Tensor
    entropy_kept: torch.Tensor

    @classmethod
    def stack(cls, updates: list[UpdateStats]) -> UpdateStats:
        """The step's updates, in order: [U] of each statistic."""
        return cls(*(torch.stack(values) for values in zip(*updates, strict=True)))
