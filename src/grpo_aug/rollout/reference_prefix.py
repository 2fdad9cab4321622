"""Guided rows for groups the policy cannot solve (`rollout/reflect=prefix`): a start inside the
reference solution.

A group in which every row is wrong has no reward spread and teaches nothing. For such a group,
its last rows are sampled again with the first steps of the prompt's reference solution already
written at the start of the completion: the group's last row gets all of the reference's
calculation lines but the last `steps_left[0]`, and writes those and the answer line itself; the
row before it gets all but the last `steps_left[1]`, and so on (R^3-style: start near the end,
where a policy that can do one step more succeeds). A row whose share of the reference would be
empty stays as it was.

How they are trained. The given prefix is part of the row's completion, so the rewards read the
whole solution and every later token is scored after it, but its tokens carry no loss
(`Rollout.given`, removed by the loss mask): the policy did not write them. The tokens it did
write were sampled from pi(. | prompt, prefix, earlier tokens), exactly the context the update
scores them in, so their ratio needs no off-policy correction (unlike a hint in the question,
rollout/reflect.py, which the update never shows the policy). What a guided row teaches is
the step after the prefix: a right ending gets a positive advantage against the group's wrong
rows. The pass rate a prompt's history records counts the unguided rows only.

The prefix is tokenized as the continuation of the formatted prompt; a row whose prompt tokens
are not a prefix of its guided context's (a tokenizer that merges across the boundary) stays
unguided, and the count is logged once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence

import torch

from grpo_aug.answers import AUTO, AnswerFormat
from grpo_aug.data.records import Prompt
from grpo_aug.engines.rows import replace_rows
from grpo_aug.engines.types import Rollout, rollout_from_ids
from grpo_aug.errors import UsageError
from grpo_aug.mathtext import ANNOTATION

log = logging.getLogger(__name__)


def reference_steps(solution: str) -> list[str]:
    """The calculation lines of a reference solution: every non-empty line before the `####` answer."""
    head = solution.split("####", 1)[0]
    return [line for line in head.split("\n") if line.strip()]


OPERATOR = re.compile(r"(?<=[\d)])\s*([-+*/])\s*")  # a binary operator: after a digit or a ')'


def spelled_out(line: str) -> str:
    """A reference line with its calculator annotations (`mathtext.ANNOTATION`) written as text, for
    a model that never saw them (an instruct model): where the equation is already written (GSM8K's
    `48/2 = <<48/2=24>>24`) the annotation goes; a bare one (the synthetic source's `<<25-8=17>>17`)
    becomes `25 - 8 = 17`."""
    def text(m: re.Match) -> str:
        if m.string[: m.start()].rstrip().endswith("="):
            return ""
        return OPERATOR.sub(r" \1 ", m.group(1).strip()) + " = "

    return ANNOTATION.sub(text, line)


def prefix_text(solution: str, steps_left: int, spell_out: bool = False) -> str | None:
    """The reference's lines but the last `steps_left`, each ending in a newline (calculator
    annotations `spelled_out` if asked); None if none remain."""
    lines = reference_steps(solution)
    keep = len(lines) - steps_left
    if keep < 1:
        return None
    return "".join((spelled_out(line) if spell_out else line) + "\n" for line in lines[:keep])


class ReferencePrefix:
    active = True
    off_policy = False  # the guided tokens were sampled in the context the update scores them in

    def __init__(self, steps_left: Sequence[int] = (1, 2), answer: AnswerFormat | None = None,
                 spell_out: bool = False, temperature: float | None = None) -> None:
        """steps_left: per guided row (from the group's last row back), the calculation steps it
        writes itself; one entry per guided row. spell_out: the reference's calculator annotations
        written as text (`spelled_out`), for a policy that was never taught them. temperature: what
        every guided row samples at; None: the temperature slot of the row it replaces."""
        if not steps_left or any(int(k) < 1 for k in steps_left):
            raise UsageError(f"rollout.reflect.steps_left must be a non-empty list of steps >= 1 (one per guided "
                             f"row: the steps it writes itself), got {list(steps_left)}")
        if temperature is not None and not temperature > 0:
            raise UsageError(f"rollout.reflect.temperature must be > 0 (or null: the replaced row's own), "
                             f"got {temperature}")
        self.steps_left, self.answer = [int(k) for k in steps_left], answer or AUTO
        self.spell_out = bool(spell_out)
        self.temperature = None if temperature is None else float(temperature)
        self.tokenizer = None
        self.unaligned = 0  # rows left unguided: prompt tokens not a prefix of the guided context's

    def bind(self, tokenizer) -> None:
        """The run's tokenizer: how many tokens of a row's budget its prefix takes."""
        self.tokenizer = tokenizer

    def given_tokens(self, contexts: list[str], prompt_tokens: torch.Tensor) -> torch.Tensor:
        """[m] how many tokens each guided context adds to its row's prompt (prompt_tokens [m]): the
        completion's given part."""
        if self.tokenizer is None:
            raise RuntimeError("ReferencePrefix.apply before bind(tokenizer)")
        lengths = [len(ids) for ids in self.tokenizer(contexts, add_special_tokens=False)["input_ids"]]
        return torch.tensor(lengths) - prompt_tokens.cpu()

    def apply(self, generate: Callable[..., Rollout], prompt_format: Callable[..., list[str]],
              prompts: Sequence[Prompt], ro: Rollout, rows_per_prompt: int, pad_id: int,
              ) -> tuple[Rollout, torch.Tensor]:
        """The rollout with the last rows of every all-wrong group replaced by guided rows (their
        prefix marked in `given`), and which rows those are ([n*R] bool).
        `generate(texts, temperatures, given)` samples rows whose completions begin with `given`
        [m] tokens already written (the budget counts them)."""
        R = rows_per_prompt
        k = min(len(self.steps_left), R - 1)  # at least one unguided row stays
        guided = torch.zeros(len(ro.texts), dtype=torch.bool)
        targets, texts, prefixes = [], [], []
        for b, prompt in enumerate(prompts):
            if any(self.answer.correct(text, prompt.answer) for text in ro.texts[b * R : (b + 1) * R]):
                continue
            base = prompt_format([prompt.prompt], [prompt.context])[0]
            for i in range(k):
                prefix = prefix_text(prompt.solution, self.steps_left[i], self.spell_out)
                if prefix is None:
                    continue
                targets.append(b * R + R - 1 - i)  # the group's last row gets the longest prefix
                texts.append(base + prefix)
                prefixes.append(prefix)
        if not targets:
            return ro, guided
        index = torch.tensor(targets, device=ro.input_ids.device)
        temperatures = (ro.temperatures[index] if self.temperature is None
                        else torch.full((len(targets),), self.temperature, device=ro.temperatures.device))  # [m]
        keep = ro.attention_mask[index, : ro.prompt_len].bool()  # [m, P] each row's prompt tokens
        # the prefix is the end of each context
        fresh = generate(texts, temperatures, self.given_tokens(texts, keep.sum(dim=1)))
        context = fresh.attention_mask[:, : fresh.prompt_len].bool()
        done = fresh.completion_mask.bool()
        rows, kept, prompt_ids, completion_ids, logprobs, given_len, out_texts, finished = ([] for _ in range(8))
        for i, r in enumerate(targets):
            original = ro.input_ids[r, : ro.prompt_len][keep[i]].tolist()
            seen = fresh.input_ids[i, : fresh.prompt_len][context[i]].tolist()
            if seen[: len(original)] != original:
                self.unaligned += 1
                if self.unaligned == 1:
                    log.warning("rollout/reflect=prefix: a prompt's tokens are not a prefix of its guided "
                                "context's (the tokenizer merges across the boundary); such rows stay unguided")
                continue
            given = seen[len(original) :]
            sampled = fresh.input_ids[i, fresh.prompt_len :][done[i]].tolist()
            rows.append(r)
            kept.append(i)
            prompt_ids.append(original)
            completion_ids.append(given + sampled)
            logprobs.append([0.0] * len(given) + (fresh.sample_logprobs[i][done[i]].tolist()
                                                  if fresh.sample_logprobs is not None else [0.0] * len(sampled)))
            given_len.append(len(given))
            out_texts.append(prefixes[i] + fresh.texts[i])
            finished.append(not bool(fresh.truncated[i]))
        if not rows:
            return ro, guided
        at = torch.tensor(rows, device=ro.input_ids.device)
        spliced = rollout_from_ids(prompt_ids, completion_ids,
                                   logprobs if ro.sample_logprobs is not None else None,
                                   temperatures[kept], out_texts, finished, pad_id, ro.input_ids.device)
        T = spliced.completion_mask.shape[1]
        given = torch.arange(T)[None, :] < torch.tensor(given_len)[:, None]  # [m, T]
        spliced = spliced._replace(given=given.to(ro.input_ids.device))
        guided[at.cpu()] = True
        return replace_rows(ro, at, spliced, pad_id), guided
