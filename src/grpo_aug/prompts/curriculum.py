"""Curriculum schedules (`curriculum/...`): bucket weights as a function of the step.

Steps here are rollout batches (the sampler's steps), `total_steps` the run's number of them.
    staged    piecewise-constant weights by fraction of the run (default: easy-heavy first,
              then step by step toward hard)
    linear    weights interpolated from `start` at step 0 to `end` at the last step
    adaptive  AdaRFT-like: a target difficulty in [0, 2] (easy 0, medium 1, hard 2) moves with
              the observed success rate toward `target_success`; its weights split between the
              two buckets around it. Step k's weights use the difficulty after step k - 2's reward:
              Lightning fetches step k's batch while step k - 1 is still running, and a fixed lag
              makes a resumed run draw exactly the batches an uninterrupted one would.
    bandit    (Self-Evolving-Curriculum-like) each bucket's value is a running mean of the share of
              its groups that came out with reward spread, the groups that teach; buckets are drawn
              by softmax(value / temperature) with an exploration floor, so a bucket where every
              group is flat (always solved, or never) is only probed. Same two-step lag.
              With `predicted`, a bucket's value follows the prompt selector's predicted share of
              its candidates with spread instead.
Every schedule has observe(step, seen) (a no-op unless adaptive or bandit; the prompt feed calls it
after each rollout with a `BucketStep` per bucket the step held, pooled over ranks: its mean reward, its
share of groups with reward spread, the selector's predicted share and the bucket's share of the
step's groups) and state_dict/load_state_dict. A mixed batch (data.mix_buckets) moves the adaptive
difficulty by the step's overall reward and every bucket's bandit value by `rate` x its share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from grpo_aug.data.records import BUCKETS
from grpo_aug.errors import UsageError


def _check_weights(weights: Mapping[str, float], where: str) -> dict[str, float]:
    for name, w in weights.items():
        if name not in BUCKETS:
            raise UsageError(f"{where}: unknown bucket {name!r}, expected one of {list(BUCKETS)}")
        if w < 0:
            raise UsageError(f"{where}: weight of {name!r} is negative ({w})")
    total = sum(weights.values())
    if abs(total - 1.0) > 1e-6:
        raise UsageError(f"{where}: weights must sum to 1, got {total:g}")
    return {b: float(weights.get(b, 0.0)) for b in BUCKETS}


class BucketStep(NamedTuple):
    """One bucket's groups in one step, pooled over ranks."""
    reward: float  # mean reward of its scored rows
    informative: float  # share of its groups (with a defined std) whose rewards differ
    predicted: float | None = None  # the selector's predicted share of its candidates with spread (None: uncalibrated)
    share: float = 1.0  # its share of the step's groups (1: a one-bucket batch)


class _Stateless:
    def observe(self, step: int, seen: Mapping[str, BucketStep]) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class StagedSchedule(_Stateless):
    """Stage i applies while step < until_i * total_steps."""

    def __init__(self, stages: Sequence[Mapping]) -> None:
        if not stages:
            raise UsageError("prompts.curriculum.stages is empty")
        self.stages = []
        last = 0.0
        for i, stage in enumerate(stages):
            until = float(stage["until"])
            if not last < until <= 1.0:
                raise UsageError(f"prompts.curriculum.stages[{i}].until must increase within (0, 1], got {until}")
            last = until
            self.stages.append((until, _check_weights(stage["weights"], f"prompts.curriculum.stages[{i}].weights")))
        if last != 1.0:
            raise UsageError(f"prompts.curriculum.stages[-1].until must be 1.0, got {last}")

    def weights(self, step: int, total_steps: int) -> dict[str, float]:
        progress = step / max(total_steps, 1)
        for until, weights in self.stages:
            if progress < until:
                return weights
        return self.stages[-1][1]

    def buckets_used(self) -> dict[str, str]:
        """Each bucket some step may draw -> the config key that asks for it."""
        used: dict[str, str] = {}
        for i, (_, weights) in enumerate(self.stages):
            for b, w in weights.items():
                if w > 0:
                    used.setdefault(b, f"prompts.curriculum.stages[{i}].weights.{b}")
        return used


class LinearSchedule(_Stateless):
    def __init__(self, start: Mapping[str, float], end: Mapping[str, float]) -> None:
        self.start = _check_weights(start, "prompts.curriculum.start")
        self.end = _check_weights(end, "prompts.curriculum.end")

    def weights(self, step: int, total_steps: int) -> dict[str, float]:
        frac = min(max(step / max(total_steps - 1, 1), 0.0), 1.0)
        return {b: (1 - frac) * self.start[b] + frac * self.end[b] for b in BUCKETS}

    def buckets_used(self) -> dict[str, str]:
        used = {b: f"prompts.curriculum.end.{b}" for b in BUCKETS if self.end[b] > 0}
        used.update({b: f"prompts.curriculum.start.{b}" for b in BUCKETS if self.start[b] > 0})
        return used


def difficulty_weights(difficulty: float) -> dict[str, float]:
    """Split between the two buckets around `difficulty`: 0.3 -> easy 0.7, medium 0.3."""
    d = min(max(difficulty, 0.0), len(BUCKETS) - 1.0)
    low = min(int(math.floor(d)), len(BUCKETS) - 2)
    frac = d - low
    weights = dict.fromkeys(BUCKETS, 0.0)
    weights[BUCKETS[low]] = 1.0 - frac
    weights[BUCKETS[low + 1]] += frac
    return weights


class _Lagged:
    """State that moves with each step's groups; step k reads the state after step k - LAG.

    Subclasses keep `initial` (the state before any step) and turn one step's observations into the
    next state in `_next(before, seen)`. States must be plain floats or dicts."""

    LAG = 2
    what = "groups"

    def __init__(self, initial) -> None:
        self.initial = initial
        self.after: dict[int, object] = {}  # step -> state after observing that step

    def state_for(self, step: int):
        source = step - self.LAG
        if source < 0:
            return self.initial
        if source not in self.after:
            raise RuntimeError(f"curriculum: step {step} needs the {self.what} of step {source}, not observed yet")
        return self.after[source]

    def observe(self, step: int, seen: Mapping[str, BucketStep]) -> None:
        """seen: each bucket the step held (the buckets of its groups)."""
        self.after[step] = self._next(self.after.get(step - 1, self.initial), seen)
        for old in [s for s in self.after if s < step - self.LAG]:
            del self.after[old]  # only the last LAG + 1 states are ever read

    def _next(self, before, seen: Mapping[str, BucketStep]):
        raise NotImplementedError

    def buckets_used(self) -> dict[str, str]:
        return {b: f"curriculum ({type(self).__name__}: any bucket)" for b in BUCKETS}

    def state_dict(self) -> dict:
        return {"after": dict(self.after)}

    def load_state_dict(self, state: dict) -> None:
        self.after = {int(k): v for k, v in state["after"].items()}


class AdaptiveSchedule(_Lagged):
    """difficulty <- clip(difficulty + step_size * tanh(sharpness * (reward - target_success)), 0, 2)."""

    what = "reward"

    def __init__(self, target_success: float = 0.5, step_size: float = 0.05, sharpness: float = 5.0,
                 initial: float = 0.0) -> None:
        if not 0 < target_success < 1:
            raise UsageError(f"prompts.curriculum.target_success must be in (0, 1), got {target_success}")
        if step_size <= 0 or sharpness <= 0:
            raise UsageError(f"prompts.curriculum.step_size and prompts.curriculum.sharpness must be > 0, got "
                             f"{step_size}, {sharpness}")
        if not 0 <= initial <= len(BUCKETS) - 1:
            raise UsageError(f"prompts.curriculum.initial must be in [0, {len(BUCKETS) - 1}], got {initial}")
        super().__init__(float(initial))
        self.target_success, self.step_size, self.sharpness = target_success, step_size, sharpness

    def difficulty_for(self, step: int) -> float:
        return self.state_for(step)

    def weights(self, step: int, total_steps: int) -> dict[str, float]:
        return difficulty_weights(self.difficulty_for(step))

    def _next(self, before: float, seen: Mapping[str, BucketStep]) -> float:
        reward = sum(s.share * s.reward for s in seen.values())  # the step's, over its groups
        moved = before + self.step_size * math.tanh(self.sharpness * (reward - self.target_success))
        return min(max(moved, 0.0), len(BUCKETS) - 1.0)

    def load_state_dict(self, state: dict) -> None:
        self.after = {int(k): float(v) for k, v in state["after"].items()}


class BanditSchedule(_Lagged):
    """value[b] <- value[b] + rate * share[b] * (informative[b] - value[b]) for each bucket b a step
    held (share 1 for the bucket of a one-bucket batch);
    weights = (1 - explore) * softmax(value / temperature) + explore / len(buckets).

    predicted: value a bucket by the share of its *candidates* the prompt selector expects to come
    out with reward spread (once its predictor is calibrated), not by the rolled-out groups: the
    selector keeps those informative by sifting, so a bucket it has to sift hard looks as good
    as one it does not."""

    def __init__(self, initial: Mapping[str, float], temperature: float = 0.1, rate: float = 0.2,
                 explore: float = 0.06, predicted: bool = False) -> None:
        for name, v in initial.items():
            if name not in BUCKETS:
                raise UsageError(f"prompts.curriculum.initial: unknown bucket {name!r}, expected one of "
                                 f"{list(BUCKETS)}")
            if not 0 <= v <= 1:
                raise UsageError(f"prompts.curriculum.initial.{name} must be in [0, 1] (a share of groups), got {v}")
        if temperature <= 0:
            raise UsageError(f"prompts.curriculum.temperature must be > 0, got {temperature}")
        if not 0 < rate <= 1:
            raise UsageError(f"prompts.curriculum.rate must be in (0, 1], got {rate}")
        if not 0 < explore <= 1:
            raise UsageError(f"prompts.curriculum.explore must be in (0, 1] (0 would never re-probe a bucket), "
                             f"got {explore}")
        super().__init__({b: float(initial.get(b, 0.0)) for b in BUCKETS})
        self.temperature, self.rate, self.explore = float(temperature), float(rate), float(explore)
        self.predicted = bool(predicted)

    def values_for(self, step: int) -> dict[str, float]:
        return dict(self.state_for(step))

    def weights(self, step: int, total_steps: int) -> dict[str, float]:
        values = self.values_for(step)
        top = max(values.values())
        exp = {b: math.exp((v - top) / self.temperature) for b, v in values.items()}
        total = sum(exp.values())
        return {b: (1 - self.explore) * e / total + self.explore / len(BUCKETS) for b, e in exp.items()}

    def _next(self, before: dict[str, float], seen: Mapping[str, BucketStep]) -> dict[str, float]:
        values = dict(before)
        for bucket, s in seen.items():
            signal = s.predicted if self.predicted and s.predicted is not None else s.informative
            values[bucket] += self.rate * s.share * (signal - values[bucket])
        return values

    def load_state_dict(self, state: dict) -> None:
        self.after = {int(k): {b: float(x) for b, x in v.items()} for k, v in state["after"].items()}
