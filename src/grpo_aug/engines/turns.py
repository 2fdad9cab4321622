"""Multi-turn rollouts (`rollout/tools=...`): a completion is a transcript of policy segments and
tool (or environment) segments.

Each round, the engine generates every open row from its transcript so far until EOS, a stop
string (the tool protocol's end marker among them), or the row's remaining budget. Rows that
ended on a call get the tool's answer appended as tokens the policy did not write
(`Rollout.given`, the same mask as a reference prefix: no loss, no KL, no entropy, no log-prob,
and no place in the group statistics or the engine correction), and go on in the next round;
the others are done. An environment (tools/environment.py) also opens the transcript with its
reset observation, answers every turn, and ends the row when its episode is over. The engine is
wrapped, not changed: the hf decode prefills the transcript (rows that wait for a tool have left
the decode batch, so they stall nobody; the round's calls then run at once), and vLLM's prefix
cache keeps the transcript's keys and values.

Budgets: the policy's tokens count against `rollout.max_new_tokens` as in a single turn; the
whole transcript, tool tokens included, against `rollout.tools.max_transcript_tokens`. A row that
reaches either, or calls once more than `limits.max_calls_per_row`, ends there without EOS:
truncated, judged as today. A stop string of `rollout.stop` ends the row as it does without tools.

Under sharded weights every forward is a collective: whether another round runs is voted across
ranks (the decode loop's own stop vote, asked the other way round), and a rank with no open row
rolls out a one-token stand-in that is discarded, as the refill does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch

from grpo_aug.engines.sampling_options import SamplingOptions, cut_at_stop
from grpo_aug.engines.types import Rollout, rollout_from_ids


@dataclasses.dataclass
class Transcript:
    ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    given: list[bool] = dataclasses.field(default_factory=list)
    segments: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (role, text)
    policy_tokens: int = 0
    turns: int = 0
    calls: int = 0
    failures: int = 0
    finished: bool = False  # ended by EOS, a stop string or the end of its episode (not truncated)
    closed: bool = False  # its environment ended it
    stopped: bool = False  # ended by a stop string of rollout.stop

    def add(self, ids: list[int], logprobs: list[float], role: str, text: str) -> None:
        self.ids += ids
        self.logprobs += logprobs
        self.given += [role != "policy"] * len(ids)
        if self.segments and self.segments[-1][0] == role:  # an end marker that closed no call
            self.segments[-1] = (role, self.segments[-1][1] + text)
        else:
            self.segments.append((role, text))
        if role == "policy":
            self.policy_tokens += len(ids)


class MultiTurnEngine:
    """An engine whose completions may call tools; everything else is the wrapped engine's."""

    def __init__(self, engine, tools) -> None:
        self.engine, self.tools = engine, tools

    def __getattr__(self, name: str):
        return getattr(self.__dict__["engine"], name)

    def generate(self, policy: torch.nn.Module, tokenizer, texts: Sequence[str], temperatures: torch.Tensor,
                 top_p: float, max_new_tokens: int, generator: torch.Generator | None = None,
                 all_done: Callable[[bool], bool] | None = None, options: SamplingOptions | None = None,
                 limits: torch.Tensor | None = None, records: Sequence | None = None) -> Rollout:
        """records: each row's data record (an environment resets from it)."""
        tools, k = self.tools, options or SamplingOptions()
        # the end marker stops a segment and stays in it: the policy wrote it
        round_options = dataclasses.replace(k, stop=tuple(dict.fromkeys(k.stop + tools.stop)), include_stop=True)
        cap = tools.max_transcript_tokens
        bound = min(max_new_tokens, cap)  # the decode loop's bound: the same on every rank
        prompts = tokenizer(list(texts), add_special_tokens=False).input_ids
        rows = [Transcript() for _ in prompts]
        session = tools.session(records, len(rows))
        own = [max_new_tokens] * len(rows) if limits is None else [min(int(x), max_new_tokens) for x in limits]
        open_rows = []
        for r, outcome in enumerate(session.opening()):  # an environment's first observation
            if outcome is not None:
                self._splice(rows[r], session, r, outcome, tokenizer, cap, opening=True)
            if not rows[r].closed:
                open_rows.append(r)
        while True:
            if all_done is not None:  # a round anywhere (the first too: resets may close rows): every rank joins it
                if all_done(not open_rows):
                    break
            elif not open_rows:
                break
            if not open_rows:  # a stand-in so that this rank's forwards match the others'
                self.engine.generate(policy, tokenizer, [prompts[0]], temperatures[:1], top_p, bound,
                                     generator=generator, all_done=all_done, options=round_options,
                                     limits=torch.ones(1, dtype=torch.long))
                continue
            budget = [min(own[r] - rows[r].policy_tokens, cap - len(rows[r].ids)) for r in open_rows]
            ro = self.engine.generate(policy, tokenizer, [prompts[r] + rows[r].ids for r in open_rows],
                                      temperatures[open_rows], top_p, bound, generator=generator,
                                      all_done=all_done, options=round_options, limits=torch.tensor(budget))
            callers, segments = self._append_segments(ro, [rows[r] for r in open_rows], open_rows, tokenizer, k)
            requests = session.requests(callers, segments)
            asked = [(r, fn) for r, fn in zip(callers, requests, strict=True) if fn is not None]
            for (r, _), outcome in zip(asked, tools.runner.run([fn for _, fn in asked]), strict=True):
                self._splice(rows[r], session, r, outcome, tokenizer, cap)
            # a row goes on while it has budget left on both counts (an end marker with no call
            # before it simply continues)
            open_rows = [r for r in callers if not rows[r].closed
                         and min(own[r] - rows[r].policy_tokens, cap - len(rows[r].ids)) > 0]
        return assemble(prompts, rows, temperatures, tokenizer, k, ro_device(policy), session.rewards())

    def _append_segments(self, ro: Rollout, open_transcripts: list[Transcript], open_rows: list[int], tokenizer,
                         k: SamplingOptions) -> tuple[list[int], list[str]]:
        """Each open row's new segment joins its transcript; a row that ended (EOS, a stop string,
        its budget, one call too many) is marked. Returns the rows that asked for a call and their
        segments' text."""
        mask = ro.completion_mask.bool().cpu()  # [A, T]
        new_ids = ro.input_ids[:, ro.prompt_len :].cpu()  # [A, T]
        calls_cap = self.tools.runner.limits.max_calls_per_row
        callers, segments = [], []
        for i, (r, row) in enumerate(zip(open_rows, open_transcripts, strict=True)):
            ids = new_ids[i][mask[i]].tolist()
            lps = [0.0] * len(ids) if ro.sample_logprobs is None else ro.sample_logprobs[i].cpu()[mask[i]].tolist()
            text = tokenizer.decode(ids, skip_special_tokens=True)
            row.add(ids, lps, "policy", text)
            row.turns += 1
            if bool(ro.truncated[i]):
                continue  # its budget ran out
            if ids and ids[-1] == tokenizer.eos_token_id:
                row.finished = True
            elif cut_at_stop(text, k.stop, k.include_stop)[1]:
                row.finished = row.stopped = True
            elif row.calls >= calls_cap or row.turns > 2 * calls_cap:
                continue  # one call too many: the row ends here, truncated
            else:
                callers.append(r)
                segments.append(text)
        return callers, segments

    @staticmethod
    def _splice(row: Transcript, session, r: int, outcome, tokenizer, cap: int, opening: bool = False) -> None:
        """The answer to a call (or an environment's observation) as tokens the policy did not write."""
        row.calls += not opening
        row.failures += int(outcome.failed)
        text, ends = session.answer(r, outcome)
        ids = tokenizer(text, add_special_tokens=False).input_ids[: cap - len(row.ids)]
        if ids:
            row.add(ids, [0.0] * len(ids), session.role, tokenizer.decode(ids))
        if ends:  # the episode is over (finished), or its state is unknown after a failure (truncated)
            row.closed, row.finished = True, not outcome.failed


def ro_device(policy: torch.nn.Module) -> torch.device:
    return next(policy.parameters()).device


def assemble(prompts: list[list[int]], rows: list[Transcript], temperatures: torch.Tensor, tokenizer,
             options: SamplingOptions, device: torch.device, rewards: list[float | None] | None = None) -> Rollout:
    """The transcripts as one Rollout: policy and tool tokens in the completion, tools' in `given`."""
    texts = []
    for row in rows:
        text = tokenizer.decode(row.ids, skip_special_tokens=True)
        texts.append(cut_at_stop(text, options.stop, options.include_stop)[0] if row.stopped else text)
    ro = rollout_from_ids(prompts, [r.ids for r in rows], [r.logprobs for r in rows], temperatures, texts,
                          [r.finished for r in rows], tokenizer.pad_token_id, device)
    T = ro.completion_mask.shape[1]
    given = torch.zeros(len(rows), T, dtype=torch.bool)  # [N, T]
    for i, row in enumerate(rows):
        given[i, : len(row.given)] = torch.tensor(row.given, dtype=torch.bool)
    return ro._replace(given=given.to(device),
                       tool_calls=torch.tensor([r.calls for r in rows], device=device),
                       tool_failures=torch.tensor([r.failures for r in rows], device=device),
                       segments=[list(r.segments) for r in rows],
                       env_rewards=None if rewards is None else torch.tensor(
                           [math.nan if v is None else v for v in rewards], device=device))
