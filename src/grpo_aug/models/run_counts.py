"""What a run has survived so far (reward calls that raised or hung, skipped updates), kept in
checkpoints so that a resumed run continues the interrupted one's counts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from grpo_aug.errors import UsageError


class NonFiniteTraining(UsageError, RuntimeError):
    """Too many updates in a row were non-finite: the run stops instead of spinning."""


@dataclass
class RunCounts:
    reward_errors: Counter = field(default_factory=Counter)  # calls that raised, per reward function
    reward_timeouts: Counter = field(default_factory=Counter)  # calls past reward.timeout_s
    skipped_total: int = 0  # updates skipped for a non-finite loss or gradient norm
    consecutive_skipped: int = 0

    def add_rewards(self, names, errors: dict[str, int], timeouts: dict[str, int]) -> None:
        for name in names:
            self.reward_errors[name] += errors[name]
            self.reward_timeouts[name] += timeouts[name]

    def add_update(self, skipped: bool) -> None:
        self.skipped_total += int(skipped)
        self.consecutive_skipped = self.consecutive_skipped + 1 if skipped else 0

    def stop_if_stuck(self, limit: int, step: int, last_checkpoint: str) -> None:
        if self.consecutive_skipped >= limit:
            where = f"Last checkpoint: {last_checkpoint}." if last_checkpoint else "No checkpoint was saved yet."
            raise NonFiniteTraining(
                f"step {step}: {self.consecutive_skipped} updates in a row had a non-finite loss or gradient norm "
                f"and were skipped (algo.max_consecutive_nonfinite={limit}); the weights are those of the last "
                f"finite update. {where} "
                "Lower the lr, check the reward scale and the masks, or resume from an earlier checkpoint.")

    def state_dict(self) -> dict:
        return {"reward_errors": dict(self.reward_errors), "reward_timeouts": dict(self.reward_timeouts),
                "skipped_total": self.skipped_total, "consecutive_skipped": self.consecutive_skipped}

    def load_state_dict(self, state: dict) -> None:
        self.reward_errors = Counter(state["reward_errors"])
        self.reward_timeouts = Counter(state["reward_timeouts"])
        self.skipped_total, self.consecutive_skipped = state["skipped_total"], state["consecutive_skipped"]
