"""Prompt selectors (`prompts/selector=none|history|learned`): the chance a prompt's group comes out flat.

A flat group (every counted row gets the same reward) has zero advantage everywhere: its rollout
is compute spent on nothing. Before a rollout, the selection step (prompts/selection.py) asks the
selector for each candidate's flat probability, capped at 1 - `explore` (every prompt keeps a
chance to show that the policy changed), then skips each candidate with that probability
(`PromptSelection`) or rolls out the least likely flat (`RankedSelection`, the `learned` preset).

    none     never skips
    history  GRESO-style: flat probability 1 - decay^streak, from the prompt's flat streak alone
    learned  a logistic regression on the prompt's bucket, length, smoothed pass rate, flat streak,
             steps since last seen and (with `likelihood`) the policy's log-probability of the
             prompt's reference solution (prompts/likelihood.py), trained online on every
             rolled-out group (no second network); it skips nothing until it has seen
             `warmup_groups` groups

Selectors are deterministic functions of the shared history and their own state, which every rank
updates with the same gathered outcomes in the same order: every rank decides alike.
"""

from __future__ import annotations

import math

from grpo_aug.data.records import BUCKETS
from grpo_aug.errors import UsageError
from grpo_aug.prompts.history import PromptRecord


class _Predictor:
    def __init__(self, explore: float = 0.1) -> None:
        if not 0 < explore <= 1:
            raise UsageError(f"prompts.selector.predictor.explore must be in (0, 1], got {explore}")
        self.explore = explore

    @property
    def active(self) -> bool:
        return True

    @property
    def likelihood(self) -> bool:
        """Whether candidates come with the policy's log-probability of their reference."""
        return False

    @property
    def calibrated(self) -> bool:
        """Whether flat_probability is a probability learned from outcomes (a curriculum may read
        it), not a skip rule."""
        return False

    def skip_probability(self, length: int, bucket: str, record: PromptRecord | None, step: int,
                         reference: float | None = None) -> float:
        return min(self.flat_probability(length, bucket, record, step, reference), 1.0 - self.explore)

    def flat_probability(self, length: int, bucket: str, record: PromptRecord | None, step: int,
                         reference: float | None = None) -> float:
        raise NotImplementedError

    def learn(self, length: int, bucket: str, record: PromptRecord | None, step: int, flat: bool,
              reference: float | None = None) -> None:
        """One rolled-out group's label; `record` is the history as it was when the prompt was chosen,
        `reference` the log-probability of its reference solution then (None: not measured)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class NoPredictor(_Predictor):
    def __init__(self) -> None:
        super().__init__(explore=1.0)

    @property
    def active(self) -> bool:
        return False

    def flat_probability(self, length, bucket, record, step, reference=None) -> float:
        return 0.0


class HistoryPredictor(_Predictor):
    """A prompt seen flat `streak` times in a row is flat again with probability 1 - decay^streak."""

    def __init__(self, decay: float = 0.5, explore: float = 0.1) -> None:
        super().__init__(explore)
        if not 0 <= decay < 1:
            raise UsageError(f"prompts.selector.predictor.decay must be in [0, 1), got {decay}")
        self.decay = decay

    def flat_probability(self, length, bucket, record, step, reference=None) -> float:
        if record is None or record.flat_streak == 0:
            return 0.0
        return 1.0 - self.decay**record.flat_streak


def features(length: int, bucket: str, record: PromptRecord | None, step: int,
             reference: float | None = None) -> list[float]:
    """The learned selector's inputs, each roughly in [-1, 1]; `reference` is log p(reference solution)."""
    seen = record is not None and record.attempts > 0
    rate = record.smoothed_pass if seen else 0.0
    since = step - record.last_seen if seen else 0
    # the chance of sampling the reference word for word: near 1 for a prompt the policy has
    # mastered (all right), near 0 both for one out of reach and for long references
    certain = math.exp(min(reference, 0.0)) if reference is not None else 0.0
    return [
        1.0,  # bias
        *(float(bucket == b) for b in BUCKETS),
        min(length / 200.0, 2.0),  # prompt characters
        float(seen),
        rate,
        4.0 * rate * (1.0 - rate),  # 1 at a pass rate of 0.5 (most spread), 0 at 0 and 1
        float(seen and rate == 0.0),  # never solved yet
        float(seen and rate == 1.0),  # always solved so far
        min(record.flat_streak, 5) / 5.0 if seen else 0.0,
        math.log1p(since) / 5.0,
        float(reference is not None),
        certain,
        4.0 * certain * (1.0 - certain),
        max(reference, -20.0) / 20.0 if reference is not None else 0.0,  # how far out of reach
    ]


class LearnedPredictor(_Predictor):
    """Online logistic regression (one SGD step per rolled-out group, L2-regularised)."""

    def __init__(self, lr: float = 0.2, l2: float = 1e-4, warmup_groups: int = 64, explore: float = 0.1,
                 likelihood: bool = True) -> None:
        super().__init__(explore)
        if lr <= 0 or l2 < 0 or warmup_groups < 0:
            raise UsageError(f"prompts.selector.predictor needs lr > 0, l2 >= 0, warmup_groups >= 0; got {lr}, {l2}, "
                             f"{warmup_groups}")
        self.lr, self.l2, self.warmup_groups = lr, l2, warmup_groups
        self._likelihood = likelihood
        self.weights = [0.0] * len(features(0, BUCKETS[0], None, 0))
        self.seen = 0

    def _predict(self, x: list[float]) -> float:
        z = sum(w * v for w, v in zip(self.weights, x, strict=True))
        z = min(max(z, -30.0), 30.0)
        return 1.0 / (1.0 + math.exp(-z))

    @property
    def likelihood(self) -> bool:
        return self._likelihood

    @property
    def calibrated(self) -> bool:
        return self.seen >= self.warmup_groups

    def flat_probability(self, length, bucket, record, step, reference=None) -> float:
        if self.seen < self.warmup_groups:
            return 0.0
        return self._predict(features(length, bucket, record, step, reference))

    def learn(self, length, bucket, record, step, flat, reference=None) -> None:
        x = features(length, bucket, record, step, reference)
        error = self._predict(x) - float(flat)  # d(log-loss)/dz
        self.weights = [w - self.lr * (error * v + self.l2 * w) for w, v in zip(self.weights, x, strict=True)]
        self.seen += 1

    def state_dict(self) -> dict:
        return {"weights": list(self.weights), "seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.weights = [float(w) for w in state["weights"]]
        self.seen = int(state["seen"])
