"""Per-prompt sample history, and the online difficulty it drives.

Every rollout of a training prompt (variants are prompts of their own) adds one `Outcome`: the
group's pass rate (share of rows with the exact final answer) and whether the group was flat (no
reward spread: no policy gradient). The history keeps per prompt the attempts, the last and the
smoothed pass rate, the flat streak and the step it was last seen. Outcomes are gathered from
every rank and applied in rank order, so every rank holds the same history; it is saved in
checkpoints with the DataModule's state.

Online difficulty (`prompts/difficulty=online`): after each outcome a prompt may move to the bucket
its smoothed pass rate says it is in *now* (easy at or above `easy_at`, hard at or below
`hard_at`, medium between), with hysteresis: it leaves a bucket only once it is `margin` past that
bucket's threshold. A move observed at sampler step j applies to the batches of step j + LAG on:
Lightning draws step k's batch while step k - 1 runs, and a fixed lag makes a resumed run draw
what an uninterrupted one does (the adaptive curriculum uses the same lag).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from grpo_aug.data.records import Prompt
from grpo_aug.errors import UsageError

LAG = 2


class Outcome(NamedTuple):
    prompt_id: str
    pass_rate: float  # share of the group's rows with the exact final answer
    flat: bool  # the group's counted rewards were all equal
    bucket: str  # the bucket it was drawn from


@dataclass
class PromptRecord:
    attempts: int = 0
    last_pass: float = 0.0
    smoothed_pass: float = 0.0  # exponential moving average of the pass rate
    flat_streak: int = 0  # consecutive rollouts of this prompt that gave a flat group
    last_seen: int = -1  # sampler step of the latest rollout
    moves: list[tuple[int, str]] = field(default_factory=list)  # (first step it applies, bucket)


class StaticDifficulty:
    """Buckets stay as the data source assigned them."""

    online = False

    def bucket_after(self, current: str, record: PromptRecord) -> str:
        return current


class OnlineDifficulty:
    """The bucket the smoothed pass rate puts a prompt in now, with hysteresis."""

    online = True

    def __init__(self, easy_at: float = 0.8, hard_at: float = 0.1, margin: float = 0.1, min_attempts: int = 1) -> None:
        if not 0 <= hard_at < easy_at <= 1:
            raise UsageError(f"prompts.difficulty needs 0 <= hard_at < easy_at <= 1, got hard_at={hard_at}, "
                             f"easy_at={easy_at}")
        if not 0 <= margin < easy_at - hard_at:
            raise UsageError(f"prompts.difficulty.margin must be in [0, easy_at - hard_at), got {margin}")
        if min_attempts < 1:
            raise UsageError(f"prompts.difficulty.min_attempts must be >= 1, got {min_attempts}")
        self.easy_at, self.hard_at, self.margin, self.min_attempts = easy_at, hard_at, margin, min_attempts

    def bucket_after(self, current: str, record: PromptRecord) -> str:
        if record.attempts < self.min_attempts:
            return current
        rate = record.smoothed_pass
        # a bucket is left only once the rate is `margin` past its own threshold
        easy_at = self.easy_at - self.margin if current == "easy" else self.easy_at
        hard_at = self.hard_at + self.margin if current == "hard" else self.hard_at
        if rate >= easy_at:
            return "easy"
        if rate <= hard_at:
            return "hard"
        return "medium"


class PromptHistory:
    def __init__(self, difficulty: StaticDifficulty | OnlineDifficulty | None = None, smoothing: float = 0.5) -> None:
        if not 0 < smoothing <= 1:
            raise UsageError(f"data.history_smoothing must be in (0, 1], got {smoothing}")
        self.difficulty = difficulty or StaticDifficulty()
        self.smoothing = smoothing
        self.records: dict[str, PromptRecord] = {}
        self.static: dict[str, str] = {}  # prompt id -> the bucket its data source gave it
        self.moved: Counter[str] = Counter()  # "<from>_<to>" -> prompts moved, this run

    def start(self, static: dict[str, str]) -> None:
        """The training prompts and their starting buckets (set by the DataModule)."""
        self.static = dict(static)

    def get(self, prompt_id: str) -> PromptRecord | None:
        return self.records.get(prompt_id)

    def bucket_at(self, prompt_id: str, static: str, step: int) -> str:
        """The prompt's bucket for sampler step `step`: its latest move that applies by then."""
        record = self.records.get(prompt_id)
        bucket = static
        if record is not None:
            for applies, moved_to in record.moves:
                if applies <= step:
                    bucket = moved_to
        return bucket

    def predicted_pass(self, prompts: Sequence[Prompt], prior: float) -> list[float]:
        """Each prompt's predicted pass rate: its own smoothed one, else the mean over the prompts of
        its static bucket that were rolled out, else `prior` (the per-prompt budget reads it)."""
        seen: dict[str, list[float]] = {}
        for prompt_id, record in self.records.items():
            if record.attempts:
                seen.setdefault(self.static.get(prompt_id, ""), []).append(record.smoothed_pass)
        means = {bucket: sum(v) / len(v) for bucket, v in seen.items()}
        rates = []
        for p in prompts:
            record = self.records.get(p.id)
            rates.append(record.smoothed_pass if record is not None and record.attempts
                         else means.get(self.static.get(p.id, p.bucket), prior))
        return rates

    def observe(self, step: int, outcomes: list[Outcome]) -> dict[str, int]:
        """Apply one step's outcomes (every rank's, in rank order); returns the moves they caused."""
        moves: Counter[str] = Counter()
        a = self.smoothing
        for o in outcomes:
            r = self.records.setdefault(o.prompt_id, PromptRecord())
            r.smoothed_pass = o.pass_rate if r.attempts == 0 else (1 - a) * r.smoothed_pass + a * o.pass_rate
            r.attempts += 1
            r.last_pass = o.pass_rate
            r.flat_streak = r.flat_streak + 1 if o.flat else 0
            r.last_seen = step
            # the bucket it will have once earlier moves apply, not the one it had at this draw
            now = r.moves[-1][1] if r.moves else self.static.get(o.prompt_id, o.bucket)
            after = self.difficulty.bucket_after(now, r)
            if after != now:
                r.moves = (r.moves + [(step + LAG, after)])[-(LAG + 1):]
                moves[f"{now}_{after}"] += 1
        self.moved.update(moves)
        return dict(moves)

    def state_dict(self) -> dict:
        return {"records": {k: asdict(r) for k, r in self.records.items()}, "moved": dict(self.moved)}

    def load_state_dict(self, state: dict) -> None:
        self.records = {k: PromptRecord(**{**r, "moves": [tuple(m) for m in r["moves"]]})
                        for k, r in state["records"].items()}
        self.moved = Counter(state["moved"])
