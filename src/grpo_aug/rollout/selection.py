"""Acting on the samples before a rollout: which prompts to roll out, and what each rollout showed.

`pick` asks the selector (rollout/selector.py) for each candidate's skip probability and draws
one uniform per (seed, step, prompt): a skipped prompt is replaced by a fresh prompt of the same
bucket (at most `max_rounds` rounds of replacements, each screened the same way; then the step
trains on fewer groups, which is compute saved, not spent on groups expected to be flat). A share
`audit` of would-be skips is rolled out anyway: their outcomes measure the selector's precision.

`observe` turns the step's groups into outcomes (pass rate by exact final answer, flat or not),
gathers them from every rank, and in rank order trains the selector and updates the history, so
every rank keeps the same state. It also keeps the window counts behind

    rollout/flat_rows_frac   rows rolled out in groups that came out flat / rows rolled out: compute wasted
    selector/skip_frac       candidates skipped / candidates considered
    selector/precision       audited would-be skips that were indeed flat
    selector/recall          estimated share of flat groups the selector caught: skips x precision over
                             that plus the flat groups it let through
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import NamedTuple

from grpo_aug.data.history import Outcome, PromptHistory, PromptRecord
from grpo_aug.data.records import Prompt
from grpo_aug.rewards import MathReward
from grpo_aug.rollout.groups import PromptPool, SampledGroups
from grpo_aug.rollout.selector import NoSelector


class Picked(NamedTuple):
    prompts: list[Prompt]  # to roll out
    audited: frozenset[str]  # ids rolled out although the selector would have skipped them
    skipped: int  # candidates skipped
    considered: int  # candidates screened (the batch and its replacements)


class Gathered(NamedTuple):
    prompt_id: str
    length: int  # prompt characters
    bucket: str
    pass_rate: float
    flat: bool
    audited: bool
    rows: int  # rows rolled out for this group (oversampling included)


Gather = Callable[[object], list]  # this rank's object -> every rank's, in rank order


class PromptSelection:
    def __init__(self, selector=None, history: PromptHistory | None = None, prompt_pool: PromptPool | None = None,
                 seed: int = 0, audit: float = 0.1, max_rounds: int = 2) -> None:
        if not 0 <= audit < 1:
            raise ValueError(f"rollout.selection.audit must be in [0, 1), got {audit}")
        if max_rounds < 0:
            raise ValueError(f"rollout.selection.max_rounds must be >= 0, got {max_rounds}")
        self.selector = selector or NoSelector()
        if self.selector.active and prompt_pool is None:
            raise ValueError("rollout.selector needs a prompt pool to replace skipped prompts")
        self.history = history or PromptHistory()
        self.pool = prompt_pool
        self.seed, self.audit, self.max_rounds = seed, audit, max_rounds
        self.exact = MathReward()
        self.window = dict.fromkeys(("considered", "skipped", "audited", "audited_flat", "passed_flat", "rows",
                                     "flat_rows"), 0)

    def pick(self, batch: list[Prompt], step: int) -> Picked:
        if not self.selector.active:
            return Picked(list(batch), frozenset(), 0, len(batch))
        kept: list[Prompt] = []
        audited: set[str] = set()
        skipped = considered = 0
        candidates, used = list(batch), {p.id for p in batch}
        for round_ in range(self.max_rounds + 1):
            for p in candidates:
                considered += 1
                q = self.selector.skip_probability(len(p.prompt), p.bucket, self.history.get(p.id), step)
                draw = random.Random(f"{self.seed}-select-{step}-{p.id}")
                u, v = draw.random(), draw.random()
                if u >= q:
                    kept.append(p)
                elif v < self.audit:
                    kept.append(p)
                    audited.add(p.id)
                else:
                    skipped += 1
            need = len(batch) - len(kept)
            if need == 0 or round_ == self.max_rounds:
                break
            candidates = self.pool(batch[0].bucket, need, step, round_ + 1, used, purpose="select")
            used |= {p.id for p in candidates}
            if not candidates:
                break
        if not kept:  # a step never rolls out nothing: the first prompt goes anyway, as an audit
            kept, audited, skipped = [batch[0]], {batch[0].id}, skipped - 1
        return Picked(kept, frozenset(audited), skipped, considered)

    def outcomes(self, picked: Picked, sampled: SampledGroups, rows_per_group: int) -> list[Gathered]:
        """This rank's groups as outcomes (refill groups included: they were rolled out too)."""
        G = sampled.rewards.shape[1]
        flat = (~sampled.informative).tolist()
        out = []
        for b, p in enumerate(sampled.prompts):
            texts = sampled.rollout.texts[b * G : (b + 1) * G]
            rate = sum(self.exact(p, t) for t in texts) / G
            out.append(Gathered(p.id, len(p.prompt), p.bucket, rate, flat[b], p.id in picked.audited, rows_per_group))
        return out

    def observe(self, picked: Picked, sampled: SampledGroups, step: int, rows_per_group: int,
                gather: Gather) -> dict[str, int]:
        """Train the selector and update the history with every rank's outcomes; returns the moves."""
        every = gather((self.outcomes(picked, sampled, rows_per_group), picked.skipped, picked.considered))
        outcomes: list[Gathered] = []
        for groups, skipped, considered in every:
            outcomes += groups
            self.window["skipped"] += skipped
            self.window["considered"] += considered
        for o in outcomes:
            record: PromptRecord | None = self.history.get(o.prompt_id)
            self.selector.learn(o.length, o.bucket, record, step, o.flat)
            self.window["rows"] += o.rows
            self.window["flat_rows"] += o.rows * o.flat
            if o.audited:
                self.window["audited"] += 1
                self.window["audited_flat"] += o.flat
            else:
                self.window["passed_flat"] += o.flat
        return self.history.observe(step, [Outcome(o.prompt_id, o.pass_rate, o.flat, o.bucket) for o in outcomes])

    def window_metrics(self) -> dict[str, float]:
        """The counts since the last call as rates; then a new window starts."""
        w = self.window
        values = {}
        if w["rows"]:
            values["rollout/flat_rows_frac"] = w["flat_rows"] / w["rows"]
        if self.selector.active:
            values["selector/skip_frac"] = w["skipped"] / max(w["considered"], 1)
            if w["audited"]:
                precision = w["audited_flat"] / w["audited"]
                values["selector/precision"] = precision
                caught = w["skipped"] * precision
                if caught + w["passed_flat"] > 0:
                    values["selector/recall"] = caught / (caught + w["passed_flat"])
        self.window = dict.fromkeys(w, 0)
        return values

    def state_dict(self) -> dict:
        return {"selector": self.selector.state_dict(), "window": dict(self.window)}

    def load_state_dict(self, state: dict) -> None:
        self.selector.load_state_dict(state["selector"])
        self.window = dict(state["window"])
