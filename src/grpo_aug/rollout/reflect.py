"""Reflective regeneration (`rollout/reflect=none|hint`): a group in which every row is wrong
teaches nothing (flat rewards). For such a group, `rows` of its rows are sampled again from the
same policy with a hint added to the question, and replace its last rows:

    first_step    "Hint: the first step is 48/2 = 24." (the reference solution's first calculation)
    wrong_answer  "Hint: a previous attempt answered 73, which is wrong." (the group's most common answer)

Which prompt the hinted rows train under: the original one. The goal is a policy that solves the
problem without the hint, so their tokens are scored, and their advantage computed, under the
original prompt, next to the group's unhinted rows. That makes them off-policy: they were sampled
from pi(. | prompt + hint), not pi(. | prompt). The update corrects this explicitly: for hinted
rows the "old" log-probs of the clipped ratio are the sampler's own log-probs under the hinted
prompt (`Rollout.sample_logprobs`), so each token's ratio is pi_theta(y | prompt) / pi_behaviour(y |
prompt + hint), an importance weight, and the PPO clip bounds it: a token the hint made much
likelier has a ratio well below 1 and, with a positive advantage, pushes with that small weight.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

import torch

from grpo_aug.answers import AUTO, AnswerFormat
from grpo_aug.data.records import Prompt
from grpo_aug.engines.rows import replace_rows
from grpo_aug.engines.types import Rollout, rollout_from_ids
from grpo_aug.errors import UsageError
from grpo_aug.mathtext import ANNOTATION

HINTS = ("first_step", "wrong_answer")


class NoReflection:
    active = False

    def bind(self, tokenizer) -> None:
        pass


class Reflection:
    active = True
    off_policy = True  # sampled under another prompt than the one the update scores them in

    def __init__(self, rows: int = 2, hint: str = "first_step", answer: AnswerFormat | None = None) -> None:
        if rows < 1:
            raise UsageError(f"rollout.reflect.rows must be >= 1, got {rows}")
        if hint not in HINTS:
            raise UsageError(f"rollout.reflect.hint must be one of {list(HINTS)}, got {hint!r}")
        self.rows, self.hint, self.answer = rows, hint, answer or AUTO

    def bind(self, tokenizer) -> None:
        pass  # a hinted row samples in its own prompt: its budget is max_new_tokens, as any row's

    def hint_for(self, prompt: Prompt, completions: Sequence[str]) -> str | None:
        """The hint for this prompt, or None when there is none to give."""
        if self.hint == "first_step":
            step = ANNOTATION.search(prompt.solution)
            return None if step is None else f"Hint: the first step is {step.group(1)} = {step.group(2)}."
        stated = [a for a in (self.answer.extract(c) for c in completions) if a is not None]
        if not stated:
            return None
        common = collections.Counter(stated).most_common(1)[0][0]
        return f"Hint: a previous attempt answered {common}, which is wrong."

    def apply(self, generate: Callable[..., Rollout], prompt_format: Callable[..., list[str]],
              prompts: Sequence[Prompt], ro: Rollout, rows_per_prompt: int, pad_id: int,
              ) -> tuple[Rollout, torch.Tensor]:
        """The rollout with the last rows of every all-wrong group replaced by hinted rows, and
        which rows those are ([n*R] bool). `generate(texts, temperatures)` samples rows."""
        R, k = rows_per_prompt, min(self.rows, rows_per_prompt - 1)  # at least one unhinted row stays
        hinted = torch.zeros(len(ro.texts), dtype=torch.bool)
        if ro.sample_logprobs is None:
            raise UsageError("rollout/reflect needs an engine that reports its log-probs (the off-policy correction)")
        targets, texts, contexts = [], [], []
        for b, prompt in enumerate(prompts):
            group = ro.texts[b * R : (b + 1) * R]
            if any(self.answer.correct(text, prompt.answer) for text in group):
                continue
            hint = self.hint_for(prompt, group)
            if hint is None:
                continue
            question = f"{prompt.question} {hint}"
            hinted_prompt = prompt.prompt.replace(prompt.question, question, 1)
            rows = list(range(b * R + R - k, (b + 1) * R))
            targets += rows
            texts += [hinted_prompt] * k
            contexts += [prompt.context] * k
        if not targets:
            return ro, hinted
        index = torch.tensor(targets, device=ro.input_ids.device)
        fresh = generate(prompt_format(texts, contexts), ro.temperatures[index])  # under the hinted prompts
        # the hinted completions under the original prompts, with the sampler's (hinted) log-probs
        keep = ro.attention_mask[index, : ro.prompt_len].bool()
        done = fresh.completion_mask.bool()
        spliced = rollout_from_ids(
            [ro.input_ids[r, : ro.prompt_len][keep[i]].tolist() for i, r in enumerate(targets)],
            [fresh.input_ids[i, fresh.prompt_len :][done[i]].tolist() for i in range(len(targets))],
            [fresh.sample_logprobs[i][done[i]].tolist() for i in range(len(targets))],
            ro.temperatures[index], fresh.texts, (~fresh.truncated).tolist(), pad_id, ro.input_ids.device)
        hinted[index.cpu()] = True
        return replace_rows(ro, index, spliced, pad_id), hinted
