"""Generation ahead of training (`rollout.ahead=k`): the rollout of a batch runs while an earlier
batch trains, and is trained k steps after it was requested.

A training step with k >= 1 (models/group_sources.py, `SampleAhead`):

    1. the feed picks this call's batch with the policy as it is now; its rollout is submitted to
       one worker thread, which samples it from the sampler's weights (version v = the rollout
       steps trained so far)
    2. the oldest queued rollout (requested k calls ago) is taken; rows staler than k versions
       are dropped (`drop_stale`); the feed observes it; the policy trains on it, the ratio's
       denominator being the sampler's own log-probs
    3. the worker is drained and the new weights are pushed to the sampler (`PolicyCopy.push`): no
       rollout is ever sampled from weights that change under it

So each rollout overlaps one training step, and every row is trained exactly k versions after
the weights that sampled it. The first call queues the batches of data steps 0..k at once
(prompts/datamodule.py, `StepBatches`) and trains on step 0's: every call trains.

The hf engine samples from a copy of the policy (`PolicyCopy`), an external engine (a vLLM server)
from its own weights; either way the push happens on the main thread, between steps. Callbacks,
logging and checkpoints run only while the worker is idle.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import torch

from grpo_aug.data.records import Prompt
from grpo_aug.errors import UsageError
from grpo_aug.step_types import Picked, SampledGroups


def stale_rows(versions: torch.Tensor, current: int, bound: int) -> torch.Tensor:
    """[...] bool: rows sampled more than `bound` versions before `current`."""
    return versions < current - bound


def drop_stale(sampled: SampledGroups, current: int, bound: int) -> tuple[SampledGroups, int]:
    """The groups with rows staler than `bound` versions left out of the update (their rows no
    longer valid, their groups no longer informative or kept), and how many rows that dropped."""
    stale = stale_rows(sampled.versions, current, bound) & sampled.rows_present  # [n, G]
    dropped = int(stale.sum())
    if dropped == 0:
        return sampled, 0
    valid = sampled.valid & ~stale
    left = valid.any(dim=1)  # [n]
    return sampled._replace(valid=valid, informative=sampled.informative & left, kept=sampled.kept & left), dropped


class QueuedRollout(NamedTuple):
    """A batch picked for a rollout on the worker, and the rollout to come."""

    picked: Picked
    rollout_step: int  # the data sampler's step of the batch
    version: int  # rollout steps trained when it was submitted: the sampler's weights
    result: Future  # -> SampledGroups


class PolicyCopy:
    """The weights an hf-engine rollout samples from while the policy trains: a copy of the
    policy, overwritten from it (`push`) between steps. An external engine is its own sampler."""

    def __init__(self, policy: torch.nn.Module) -> None:
        self.model = copy.deepcopy(policy).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def push(self, policy: torch.nn.Module) -> None:
        for mine, theirs in zip(self.model.state_dict().values(), policy.state_dict().values(), strict=True):
            mine.copy_(theirs)


class AheadQueue:
    """Rollouts requested ahead of training: one worker thread, first in first out."""

    def __init__(self, depth: int) -> None:
        if depth < 1:
            raise UsageError(f"AheadQueue needs rollout.ahead >= 1, got {depth}")
        self.depth = depth
        self.jobs: deque[QueuedRollout] = deque()
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-ahead")
        self.dropped = 0  # stale rows dropped, this run

    def submit(self, picked: Picked, rollout_step: int, version: int, sample) -> None:
        """sample(): the rollout of `picked`, run on the worker."""
        self.jobs.append(QueuedRollout(picked, rollout_step, version, self.worker.submit(sample)))

    @property
    def ready(self) -> bool:
        """More than `depth` rollouts queued: the oldest is due for training."""
        return len(self.jobs) > self.depth

    def take(self, current: int) -> tuple[QueuedRollout, SampledGroups, int]:
        """The oldest rollout, versioned, its rows staler than `depth` versions dropped."""
        job = self.jobs.popleft()
        sampled = job.result.result()
        sampled = sampled._replace(versions=torch.full_like(sampled.valid, job.version, dtype=torch.long))  # [n, G]
        sampled, dropped = drop_stale(sampled, current, self.depth)
        self.dropped += dropped
        return job, sampled, dropped

    def drain(self) -> None:
        """Wait until every queued rollout has been sampled (a raise in one surfaces here)."""
        for job in self.jobs:
            job.result.result()

    def pending(self) -> list[dict[str, Any]]:
        """The queued batches as plain data, for a checkpoint: they are sampled again on resume."""
        return [{"prompts": [dataclasses.asdict(p) | {"context": _plain(p.context)} for p in job.picked.prompts],
                 "audited": sorted(job.picked.audited), "skipped": job.picked.skipped,
                 "considered": job.picked.considered, "references": dict(job.picked.references),
                 "flat_predicted": job.picked.flat_predicted, "rows": job.picked.rows, "rollout_step": job.rollout_step}
                for job in self.jobs]

    def close(self) -> None:
        self.worker.shutdown(wait=True, cancel_futures=True)


def _plain(context):
    return None if context is None else [list(turn) for turn in context]


def pending_picked(entry: dict[str, Any]) -> tuple[Picked, int]:
    """A checkpoint's queued batch (`AheadQueue.pending`) back as the feed's pick and its data step."""
    prompts = []
    for fields in entry["prompts"]:
        context = fields.get("context")
        prompts.append(Prompt(**{**fields, "context": None if context is None else tuple(map(tuple, context))}))
    picked = Picked(prompts, frozenset(entry["audited"]), entry["skipped"], entry["considered"],
                    dict(entry["references"]), entry["flat_predicted"], entry.get("rows"))
    return picked, int(entry["rollout_step"])
