"""Tools and engines for the tool tests (tests/ is on the path, so config may name them by import path)."""

from __future__ import annotations

import os
import time

import lightning as L

from grpo_aug.engines.hf import HFEngine
from grpo_aug.engines.types import rollout_from_ids


def raising(argument: str) -> str:
    raise RuntimeError(f"cannot handle {argument!r}")


def sleeping(argument: str) -> str:
    time.sleep(30)
    return "too late"


def huge(argument: str) -> str:
    return "7" * 1_000_000


def echo(argument: str) -> str:
    return "xy"


def lookup(city: str, unit: str = "celsius") -> str:
    """Get the temperature in a city.

    Args:
        city: the city's name, e.g. "Paris".
        unit: "celsius" or "fahrenheit".
    """
    return f"21 {unit}"


class ForcedFirstCall(HFEngine):
    """The hf engine, except that a row's first segment is `first` (a tool call) whatever the policy
    wrote: a random tiny model rarely writes a call by itself. The policy still runs every forward
    (under sharded weights they are collectives); its first segment is then replaced, with
    log-prob 0. ranks: the ranks where this happens (None: all)."""

    def __init__(self, first: str = "[1+1]", ranks: list[int] | None = None, captured_decode: bool = False,
                 sample_dtype: str | None = None) -> None:
        super().__init__(captured_decode, sample_dtype)
        self.first, self.ranks = first, ranks

    def generate(self, policy, tokenizer, texts, temperatures, top_p, max_new_tokens, generator=None,
                 all_done=None, options=None, limits=None, records=None):
        ro = super().generate(policy, tokenizer, texts, temperatures, top_p, max_new_tokens, generator, all_done,
                              options, limits)
        contexts = [tokenizer.decode(t) if not isinstance(t, str) else t for t in texts]
        rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
        if not all(c.endswith("A: ") for c in contexts) or (self.ranks is not None and rank not in self.ranks):
            return ro  # not every row's first segment, or not this rank
        ids = [tokenizer(t, add_special_tokens=False).input_ids if isinstance(t, str) else list(t) for t in texts]
        call = tokenizer(self.first, add_special_tokens=False).input_ids
        return rollout_from_ids(ids, [call] * len(ids), [[0.0] * len(call)] * len(ids), temperatures,
                                [self.first] * len(ids), [True] * len(ids), tokenizer.pad_token_id,
                                next(policy.parameters()).device)


class Scripted:
    """An engine that writes what a script says: context text -> (next segment, ends with EOS).
    Token log-probs are -0.01 x (position in the segment + 1), so a test can place them by hand."""

    name, external = "scripted", False

    def __init__(self, script: dict[str, tuple[str, bool]]) -> None:
        self.script = script
        self.calls: list[tuple[list[str], list[int]]] = []  # (contexts, limits) per round

    def generate(self, policy, tokenizer, texts, temperatures, top_p, max_new_tokens, generator=None,
                 all_done=None, options=None, limits=None, records=None):
        ids = [tokenizer(t, add_special_tokens=False).input_ids if isinstance(t, str) else list(t) for t in texts]
        contexts = [tokenizer.decode(i) for i in ids]
        budgets = [max_new_tokens] * len(ids) if limits is None else limits.tolist()
        self.calls.append((contexts, budgets))
        out, lps, texts_out, finished = [], [], [], []
        for context, budget in zip(contexts, budgets, strict=True):
            segment, eos = self.script[context]
            tokens = tokenizer(segment, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] * eos
            done = len(tokens) <= budget
            tokens = tokens[:budget]
            out.append(tokens)
            lps.append([-0.01 * (k + 1) for k in range(len(tokens))])
            texts_out.append(tokenizer.decode(tokens, skip_special_tokens=True))
            finished.append(done)
        return rollout_from_ids(ids, out, lps, temperatures, texts_out, finished, tokenizer.pad_token_id, "cpu")


class GuessTheAnswer:
    """An environment: the policy guesses the record's answer, one guess a turn; 'lower'/'higher'
    after a wrong one; the episode ends on the right guess. Reward: 1 / guesses taken (0 unsolved)."""

    def __init__(self) -> None:
        self.answer, self.guesses, self.solved = None, 0, False

    def reset(self, record) -> str:
        self.answer = int(record.answer)
        return "Guess it.\n"

    def step(self, action: str) -> tuple[str, bool]:
        self.guesses += 1
        digits = "".join(c for c in action if c.isdigit())
        if digits and int(digits) == self.answer:
            self.solved = True
            return "right!", True
        return ("lower\n" if digits and int(digits) > self.answer else "higher\n"), False

    def reward(self) -> float:
        return 1.0 / self.guesses if self.solved else 0.0


class Broken(GuessTheAnswer):
    def step(self, action: str) -> tuple[str, bool]:
        raise KeyError("no such move")


class Boom(L.Callback):
    """A callback that fails the way a bug does (train.py must keep its traceback)."""

    def on_train_start(self, trainer, pl_module) -> None:
        1 / 0  # noqa: B018


class EngineCrash(RuntimeError):
    """What an engine's own failure looks like: no collective backend in its words."""


class RaisesMidGeneration(HFEngine):
    """The hf engine, except that on rank `rank`, in the rollout of optimizer step `step`, the
    policy's `after`-th forward of the decode raises: the engine fails mid-generation while the
    other rank goes on decoding (under FSDP2 its forwards wait on this rank's all-gathers)."""

    def __init__(self, rank: int = 1, step: int = 5, after: int = 3, captured_decode: bool = False,
                 sample_dtype: str | None = None) -> None:
        super().__init__(captured_decode, sample_dtype)
        self.rank, self.step, self.after = rank, step, after
        self.synced: int | None = None

    def sync(self, policy, step: int) -> None:
        self.synced = step

    def generate(self, policy, tokenizer, texts, temperatures, top_p, max_new_tokens, generator=None,
                 all_done=None, options=None, limits=None, records=None):
        rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
        if self.synced != self.step or rank != self.rank or generator is None:  # greedy evaluation: no generator
            return super().generate(policy, tokenizer, texts, temperatures, top_p, max_new_tokens, generator,
                                    all_done, options, limits)
        forwards = [0]

        def count(module, args, kwargs):
            forwards[0] += 1
            if forwards[0] == self.after:
                raise EngineCrash(f"the engine crashed at its decode forward {self.after}")

        # the embedding runs in every forward, the lean decode's included
        handle = policy.get_input_embeddings().register_forward_pre_hook(count, with_kwargs=True)
        try:
            return super().generate(policy, tokenizer, texts, temperatures, top_p, max_new_tokens, generator,
                                    all_done, options, limits)
        finally:
            handle.remove()
