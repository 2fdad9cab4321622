"""Sampling whole groups: G rows per prompt, scored and deduplicated, with the zero-std refill.

`GroupRollout.sample_round` rolls out one batched call for a list of prompts; `sample` adds
DAPO-style dynamic sampling: while fewer than `data.batch_size` groups have reward spread, it
rolls out fresh prompts of the batch's buckets (never earlier rows) for at most
`rollout.filter.max_rounds` extra rounds. Preflight uses `sample_round` on its own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from grpo_aug.algo.group_stats import group_stats
from grpo_aug.data.bucket_shares import draw_like
from grpo_aug.data.prompt_format import PlainPrompt
from grpo_aug.data.records import Prompt
from grpo_aug.engines import Engine
from grpo_aug.engines.hf import HFEngine
from grpo_aug.engines.rows import concat_rollouts, select_rows, spread_rows
from grpo_aug.engines.turns import MultiTurnEngine
from grpo_aug.engines.types import Rollout
from grpo_aug.errors import UsageError
from grpo_aug.rewards import RewardSet
from grpo_aug.rewards.trl import TrainerState
from grpo_aug.rollout.downsample import max_variance_subset
from grpo_aug.rollout.filter import informative_groups
from grpo_aug.rollout.random_stream import RolloutStream
from grpo_aug.rollout.reference_prefix import ReferencePrefix
from grpo_aug.rollout.reflect import NoReflection, Reflection
from grpo_aug.rollout.settings import RolloutSettings
from grpo_aug.step_types import PromptPool, SampledGroups
from grpo_aug.tools.protocol import NoTools


def check_tools_alone(tools: bool, reflect: bool) -> None:
    if tools and reflect:
        raise UsageError("rollout/tools with rollout/reflect (hint or prefix): both splice text the policy did not "
                         "write into a row, and they have never been combined; use rollout/reflect=none with tools")


def widen(t: torch.Tensor, width: int, fill) -> torch.Tensor:
    """[n, g] -> [n, width], the new columns `fill` (groups laid out wider than the largest here)."""
    return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)


def merge_rounds(rounds: list[SampledGroups], pad_id: int) -> SampledGroups:
    if len(rounds) == 1:
        return rounds[0]
    return SampledGroups(
        prompts=[p for r in rounds for p in r.prompts],
        rollout=concat_rollouts([r.rollout for r in rounds], pad_id),
        rewards=torch.cat([r.rewards for r in rounds]),
        parts={k: torch.cat([r.parts[k] for r in rounds]) for k in rounds[0].parts},
        errors={k: sum(r.errors[k] for r in rounds) for k in rounds[0].errors},
        timeouts={k: sum(r.timeouts[k] for r in rounds) for k in rounds[0].timeouts},
        distinct=torch.cat([r.distinct for r in rounds]),
        scored=torch.cat([r.scored for r in rounds]),
        valid=torch.cat([r.valid for r in rounds]),
        informative=torch.cat([r.informative for r in rounds]),
        kept=torch.cat([r.kept for r in rounds]),
        std_gain=torch.cat([r.std_gain for r in rounds]),
        tokens=sum(r.tokens for r in rounds),
        rounds=len(rounds),
        external=rounds[0].external,
        hinted=None if rounds[0].hinted is None else torch.cat([r.hinted for r in rounds]),
        reflected=None if rounds[0].reflected is None else torch.cat([r.reflected for r in rounds]),
        present=None if all(r.present is None for r in rounds) else torch.cat([r.rows_present for r in rounds]),
    )


class ScoredRows(NamedTuple):
    """A round's scores, R slots per prompt (before any down-sampling to G)."""

    rewards: torch.Tensor  # [n, R] total reward, overlong term included; 0 in an absent slot
    parts: dict[str, torch.Tensor]  # name -> [n, R] each function's score, NaN where unscored
    distinct: torch.Tensor  # [n, R] bool, not a near-copy
    kept: torch.Tensor  # [n, R] bool, scored and not skipped after an error
    scored: torch.Tensor  # [n, R] bool, every function gave a score
    present: torch.Tensor  # [n, R] bool, a row fills the slot
    errors: dict[str, int]
    timeouts: dict[str, int]


class GroupRollout:
    """Stage 2 of a step, the group rollout: rolls out, scores and deduplicates groups for a
    policy (engine, temperature ladder, hints, reflection, down-sampling, overlong shaping, refill).
    The adaptive temperature controller moves the ladder through `set_temperatures`."""

    def __init__(self, settings: RolloutSettings | None = None, reward: RewardSet | None = None,
                 engine: Engine | None = None,
                 reflect: Reflection | ReferencePrefix | NoReflection | None = None,
                 prompt_format=None,
                 prompt_pool: PromptPool | None = None, seed: int = 0, tools=None) -> None:
        """prompt_format: record text -> model input text (data/prompt_format), bound to the
        tokenizer in `bind`; prompt_pool: fresh prompts for the refill (the DataModule's
        draw_prompts); seed: the rollout's random stream and the engine's; tools: what a completion
        may call (rollout/tools: tools/protocol.py), None or NoTools: single-turn completions."""
        self.settings = settings or RolloutSettings()
        if self.settings.budget.active and reflect is not None and reflect.active:
            raise UsageError("rollout/budget=informative sizes each group itself; rollout/reflect (hint or prefix) "
                             "re-samples rows of fixed slots: use one of them")
        if self.settings.filter.refill and prompt_pool is None:
            raise UsageError("rollout.filter.refill needs a prompt pool (the DataModule's draw_prompts)")
        self.tools = tools or NoTools()
        check_tools_alone(self.tools.active, reflect is not None and reflect.active)
        self.reward = reward
        self.engine = engine or HFEngine()
        if self.tools.active:  # evaluation, pass rates and preflight sample through it too
            self.engine = MultiTurnEngine(self.engine, self.tools)
        self.reflect = reflect or NoReflection()
        self.prompt_format = prompt_format or PlainPrompt()
        self.prompt_pool = prompt_pool
        self.seed = seed
        self.stream = RolloutStream(seed)
        self.tokenizer = None
        # under sharded weights: (this rank's flag) -> is it true on any rank; None: ranks decide alone
        self.any_rank: Callable[[bool], bool] | None = None

    def bind(self, tokenizer, name_or_path: str) -> None:
        """The run's tokenizer; the prompt format checks the model's chat template against it."""
        self.tokenizer = tokenizer
        self.prompt_format = self.prompt_format.bind(tokenizer, name_or_path)
        self.reflect.bind(tokenizer)
        if self.tools.active:
            self.tools.bind(tokenizer, self.prompt_format)

    def generator(self, device: torch.device, rank: int) -> torch.Generator:
        return self.stream.get(device, rank)

    def state_dict(self, device: torch.device, rank: int) -> dict:
        """Every rank's random stream (a collective: every rank calls it)."""
        return {"rng": self.stream.state(device, rank)}

    def load_state_dict(self, state: dict) -> None:
        self.stream.restored = state["rng"]  # applied by restore() at train start

    def restore(self, device: torch.device, rank: int) -> None:
        """Late, at train start: Lightning draws from the global stream while setting up."""
        self.stream.restore(device, rank)

    @property
    def temperatures(self) -> tuple[float, ...]:
        return self.settings.temperatures

    def set_temperatures(self, ladder) -> None:
        """A new temperature ladder, from the next rollout on."""
        self.settings = dataclasses.replace(self.settings, temperatures=tuple(ladder))

    def all_done(self) -> Callable[[bool], bool] | None:
        """The decode loop's stop vote under sharded weights: (this rank's rows finished) -> are
        every rank's; None: each rank stops on its own."""
        return None if self.any_rank is None else (lambda done: not self.any_rank(not done))

    def sample_round(self, policy: torch.nn.Module, prompts: list[Prompt], generator: torch.Generator | None = None,
                     state: TrainerState | None = None, rows: list[int] | None = None) -> SampledGroups:
        """Roll out the rows of every prompt in one batched call; score and dedup them; with
        rollout.oversample = k, keep the G of each prompt's k x G rows whose rewards vary most.
        rows: rows per prompt (rollout/budget); None: rows_per_prompt each."""
        s, n = self.settings, len(prompts)
        G = s.width  # group_size, or the budget's largest group
        R = max(s.rows_per_prompt, G)  # G, or k x G before down-sampling
        counts = [s.rows_per_prompt] * n if rows is None else list(rows)
        device = next(policy.parameters()).device
        ro, reflected, tokens = self._roll_out(policy, prompts, counts, R, generator)
        scored = self._score(prompts, counts, ro, R, state, device)
        short = any(c != R for c in counts)  # groups of different sizes, laid out R slots each
        if short:
            ro, _ = spread_rows(ro, counts, R)
        std_gain = torch.zeros(n, dtype=torch.float64, device=device)
        if R > G:
            ro, reflected, scored, std_gain = self._down_sample(ro, reflected, scored, G)
        rewards, parts, distinct, kept, present = (scored.rewards, scored.parts, scored.distinct, scored.kept,
                                                   scored.present)
        # near-copies, unscorable or filtered rows, and groups with too few distinct rows leave
        # the loss and the group statistics
        valid = distinct & s.dedup.groups_kept(distinct)[:, None] & kept  # [n, G]
        reflected = reflected.view(n, G).to(device) if self.reflect.active else None  # [n, G]
        informative = informative_groups(rewards, valid)  # [n]
        return SampledGroups(prompts, ro, rewards, parts, scored.errors, scored.timeouts, distinct, scored.scored,
                             valid, informative, informative if s.filter.zero_std else torch.ones_like(informative),
                             std_gain, tokens, external=self.engine.external,
                             hinted=reflected if self.reflect.active and self.reflect.off_policy else None,
                             reflected=reflected, present=present if short else None)

    def _roll_out(self, policy: torch.nn.Module, prompts: list[Prompt], counts: list[int], R: int,
                  generator: torch.Generator | None) -> tuple[Rollout, torch.Tensor, int]:
        """counts[b] rows of prompt b, row g at temperature (and hint) slot g, in the data's prompt
        format; all-wrong groups re-sampled where rollout/reflect says so. Returns the rollout, which
        rows were re-sampled [sum counts] and the tokens the policy wrote."""
        s = self.settings
        temperatures = s.row_temperatures(len(prompts), counts)  # [sum counts] row g at temperature slot g
        # hints go into the user message, then the template
        texts = self.prompt_format(s.row_prompts(prompts, counts),
                                   [p.context for p, c in zip(prompts, counts, strict=True) for _ in range(c)])
        records = [p for p, c in zip(prompts, counts, strict=True) for _ in range(c)]
        ro = self.engine.generate(policy, self.tokenizer, texts, temperatures, s.top_p, s.max_new_tokens,
                                  generator=generator, all_done=self.all_done(), options=s.options, records=records)
        # the policy's own tokens: a tool's output is neither generated nor counted against the budget
        tokens = int(ro.written.sum())
        reflected = torch.zeros(len(texts), dtype=torch.bool)  # [sum counts]
        if self.reflect.active:  # all-wrong groups: some rows again, with a hint or a reference prefix
            def sample(texts_, temps, given=None):
                # a row given the start of its completion writes the rest: prefix and all, no longer than any row
                limits = None if given is None else (s.max_new_tokens - given).clamp(min=1)  # [m]
                return self.engine.generate(policy, self.tokenizer, texts_, temps, s.top_p, s.max_new_tokens,
                                            generator=generator, options=s.options, limits=limits)
            ro, reflected = self.reflect.apply(sample, self.prompt_format, prompts, ro, R, self.tokenizer.pad_token_id)
        # the policy's own tokens: a reference prefix is neither generated nor counted against the budget
        tokens += int(ro.written[reflected.to(ro.written.device)].sum())
        return ro, reflected, tokens

    def _score(self, prompts: list[Prompt], counts: list[int], ro: Rollout, R: int, state: TrainerState | None,
               device: torch.device) -> ScoredRows:
        """Each row's reward (the overlong term included), parts, near-copy and scorable flags, laid
        out R slots per prompt."""
        n, s = len(prompts), self.settings
        starts = [sum(counts[:b]) for b in range(n + 1)]
        completions = [ro.texts[starts[b] : starts[b + 1]] for b in range(n)]
        ids = chats = None
        if self.reward.batched:  # functions written for TRL also take token ids and the messages seen
            ids = [row[done].tolist() for row, done in
                   zip(ro.input_ids[:, ro.prompt_len :].cpu(), ro.completion_mask.bool().cpu(), strict=True)]
            chats = [self.prompt_format.conversation(p) for p in prompts]
        scores = self.reward.score(prompts, completions, ids, state, chats)  # [n, R]
        if ro.env_rewards is not None:  # an environment's own reward: one more part of the total
            scores = scores.with_part("environment", ro.env_rewards, counts, self.tools.reward_weight)
        lengths = ro.written.sum(dim=1)  # [n*R] the policy's own tokens
        shaping = self.reward.length_shaping(lengths, s.max_new_tokens)  # [n*R]
        present = torch.tensor([[g < c for g in range(R)] for c in counts], device=device)  # [n, R]
        shaped = torch.zeros(n, R, device=device).masked_scatter(present, shaping.to(device).float())  # [n, R]
        return ScoredRows(
            rewards=widen(scores.total, R, 0.0).to(device) + shaped,  # [n, R]
            parts={k: widen(v, R, math.nan) for k, v in scores.parts.items()},
            distinct=widen(s.dedup(completions), R, False).to(device),  # [n, R]
            kept=widen(scores.kept, R, False).to(device), scored=widen(scores.scored, R, False).to(device),
            present=present, errors=scores.errors, timeouts=scores.timeouts)

    @staticmethod
    def _down_sample(ro: Rollout, reflected: torch.Tensor, rows: ScoredRows, G: int
                     ) -> tuple[Rollout, torch.Tensor, ScoredRows, torch.Tensor]:
        """rollout.oversample: each prompt's G of R rows whose rewards vary most; the std they gain [n]."""
        n, R = rows.rewards.shape
        counted = rows.kept & rows.distinct  # [n, R]
        before = group_stats(rows.rewards[:, :G], counted[:, :G]).std  # [n] what G rows alone would have had
        keep = max_variance_subset(rows.rewards, counted, rows.distinct, G)  # [n, G] row indices within each group
        ro = select_rows(ro, (keep + torch.arange(n, device=keep.device)[:, None] * R).reshape(-1))  # [n*G] rows
        rewards, distinct, kept, scored = (t.gather(1, keep) for t in (rows.rewards, rows.distinct, rows.kept,
                                                                      rows.scored))
        reflected = reflected.view(n, R).gather(1, keep.cpu()).reshape(-1)
        parts = {k: v.gather(1, keep.cpu()) for k, v in rows.parts.items()}
        rows = rows._replace(rewards=rewards, parts=parts, distinct=distinct, kept=kept, scored=scored)
        return ro, reflected, rows, group_stats(rewards, kept & distinct).std - before

    def sample(self, policy: torch.nn.Module, batch: list[Prompt], step: int,
               generator: torch.Generator | None = None, state: TrainerState | None = None,
               rows: list[int] | None = None) -> SampledGroups:
        """The batch's groups, plus refill rounds while too few are informative (if configured).
        state: what reward functions written for TRL get as trainer_state; rows: rows per prompt of
        the batch (rollout/budget; refill prompts get group_size each), None: rows_per_prompt each."""
        rounds = [self.sample_round(policy, batch, generator, state, rows)]

        def uniform(prompts: list[Prompt]) -> list[int] | None:
            return None if rows is None else [self.settings.group_size] * len(prompts)

        wanted, f = len(batch), self.settings.filter
        informative = int(rounds[0].informative.sum())
        for round_ in range(1, f.max_rounds + 1 if f.refill else 1):
            used = {p.id for r in rounds for p in r.prompts}
            need = wanted - informative
            extra = draw_like(self.prompt_pool, batch, need, step, round_, used) if need > 0 else []
            if not (bool(extra) if self.any_rank is None else self.any_rank(bool(extra))):
                break
            if not extra:  # another rank refills: its sharded forwards need this rank's, on a stand-in, discarded
                self.sample_round(policy, batch[:1], generator, state, uniform(batch[:1]))
                continue
            rounds.append(self.sample_round(policy, extra, generator, state, uniform(extra)))
            informative += int(rounds[-1].informative.sum())
        return merge_rounds(rounds, self.tokenizer.pad_token_id)._replace(
            refill_exhausted=f.refill and informative < wanted)
