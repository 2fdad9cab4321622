"""A short supervised warm-up on demonstrations, so GRPO starts from a model that sometimes
succeeds (GRPO needs reward variance to learn anything at all).

It is deliberately partial: a fixed, small number of steps, and optionally *sloppy*
demonstrations: a share `off_by_one` of them carry a final result that is one too high (the
last calculator step and the '#### N' line), the kind of systematic error that imperfect
human or model-written solutions have. A policy imitating them is often confidently wrong
in a consistent way; only a reward signal can tell it which of its habits is right, which is
what GRPO has to do afterwards. The result is cached under outputs/cache, keyed by the
content of everything that determines it (the base model's files, the demonstrations, the
settings), never by a path: a moved checkout or a copied cache is reused as it is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from grpo_aug.data.records import Prompt
from grpo_aug.distributed import first_process
from grpo_aug.errors import UsageError
from grpo_aug.models.loading import load_policy, load_tokenizer, save_pretrained_dir
from grpo_aug.models.settings import WarmupSettings
from grpo_aug.progress import Progress
from grpo_aug.warmup.shipped import RECIPE, recipe_key, shipped_start

log = logging.getLogger(__name__)


def off_by_one(record: Prompt) -> Prompt:
    """The record with its final result raised by one in the last `<<...=R>>R` step and `#### R`."""
    wrong = str(int(record.answer) + 1)
    head, _, _ = record.solution.rpartition("####")
    steps = list(re.finditer(r"=\s*" + re.escape(record.answer) + r"\s*>>\s*" + re.escape(record.answer), head))
    if steps:
        last = steps[-1]
        head = head[: last.start()] + f"={wrong}>>{wrong}" + head[last.end() :]
    return dataclasses.replace(record, answer=wrong, solution=f"{head}#### {wrong}")


class Demonstration(NamedTuple):
    """A prompt and its solution in pieces (text, learned): a tool's output is shown, not learned."""

    prompt: str
    pieces: tuple[tuple[str, bool], ...]

    @staticmethod
    def of(record: Prompt) -> Demonstration:
        return Demonstration(record.prompt, ((record.solution, True),))

    def key(self) -> str:
        return self.prompt + "".join(text if learned else f"\0given:{text}\0" for text, learned in self.pieces)


CALCULATOR_STEP = re.compile(r"<<([^<>=]{1,200})=([^<>=]{1,40})>>\2")


def tool_demonstration(record: Prompt, call: str, end: str, result: str) -> Demonstration:
    """The record's solution with every `<<expr=R>>R` step written as a tool call,
    `{call}expr{end}` (learned) followed by the tool's answer `result` (shown, not learned)."""
    pieces, at = [], 0
    for step in CALCULATOR_STEP.finditer(record.solution):
        pieces.append((record.solution[at : step.start()] + call + step.group(1) + end, True))
        pieces.append((result.format(output=step.group(2)), False))
        at = step.end()
    pieces.append((record.solution[at:], True))
    return Demonstration(record.prompt, tuple((t, learned) for t, learned in pieces if t))


def sft_batch(tokenizer, records: Sequence[Prompt | Demonstration]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids/attention [N, L] right-padded and labels [N, L] with -100 everywhere but the solution
    (and, in a tool demonstration, the tool's answers)."""
    rows, labels = [], []
    for r in records:
        demo = r if isinstance(r, Demonstration) else Demonstration.of(r)
        prompt = tokenizer(demo.prompt, add_special_tokens=False).input_ids
        answer, learn = [], []
        for text, learned in demo.pieces:
            ids = tokenizer(text, add_special_tokens=False).input_ids
            answer += ids
            learn += ids if learned else [-100] * len(ids)
        rows.append(prompt + answer + [tokenizer.eos_token_id])
        labels.append([-100] * len(prompt) + learn + [tokenizer.eos_token_id])
    width = max(len(x) for x in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)  # [N, L]
    lab = torch.full((len(rows), width), -100)  # [N, L]
    attn = torch.zeros((len(rows), width), dtype=torch.long)  # [N, L]
    for i, (x, y) in enumerate(zip(rows, labels, strict=True)):
        ids[i, : len(x)] = torch.tensor(x)
        lab[i, : len(y)] = torch.tensor(y)
        attn[i, : len(x)] = 1
    return ids, attn, lab


def model_key(name_or_path: str | Path) -> str:
    """A local model directory by the content of its files (config, weights, tokenizer), read in
    1 MiB blocks; a hub id by its name (a hub id names one model). Hidden files and folders are
    left out: `huggingface-cli download --local-dir` keeps download metadata in `.cache/`."""
    root = Path(name_or_path)
    if not root.is_dir():
        return str(name_or_path)
    digest = hashlib.sha1()
    files = [p for p in root.rglob("*") if p.is_file() and not any(part.startswith(".") for part in
                                                                  p.relative_to(root).parts)]
    for f in sorted(files):
        digest.update(f.relative_to(root).as_posix().encode() + b"\0")
        with f.open("rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
    return "content:" + digest.hexdigest()


def supervised_warmup(name_or_path: str | Path, records: Sequence[Prompt], cache_dir: str | Path,
                      settings: WarmupSettings, seed: int = 0, tools=None, base_id: str | None = None) -> Path:
    """Train settings.steps SFT steps on the solutions of `records` in settings.buckets; return the saved dir.

    tools: a text tool protocol (rollout/tools) whose `warmup_share` of the demonstrations is
    written with tool calls, from the clean record (the calculator writes the result, so the
    planted slip has no place in it), so that RL has a rare behaviour to reinforce.
    base_id: the base model's name independent of the machine that wrote its files (the tiny
    model's build settings): with it, a shipped start of the same recipe is loaded, not built
    (warmup/shipped.py; settings.shipped=false builds it anyway)."""
    steps, lr, batch_size = settings.steps, settings.lr, settings.batch_size
    seed = seed if settings.seed is None else settings.seed
    pool = [r for r in records if r.bucket in settings.buckets]
    if not pool:
        raise UsageError(f"model.warmup.buckets={list(settings.buckets)} selects no training prompts")
    pool = demonstrations(pool, settings.off_by_one, seed, tools)
    data_key = hashlib.sha1("".join(d.key() for d in pool).encode()).hexdigest()
    spec = dict(base=model_key(name_or_path), steps=steps, lr=lr, batch_size=batch_size, seed=seed, data=data_key,
                schedule="cosine")
    recipe = None if base_id is None else {**spec, "base": base_id}
    if recipe is not None and settings.shipped:
        start = shipped_start(recipe)
        if start is not None:
            log.info("supervised warm-up: the shipped start %s (the same weights on every machine)", start)
            return start
    key = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    out = Path(cache_dir) / f"warmup-{key}"
    if (out / "config.json").is_file():
        log.info("supervised warm-up: cached at %s", out)
        return write_recipe(out, recipe)

    tokenizer = load_tokenizer(str(name_or_path))
    log.info("supervised warm-up: %d steps on %d demonstrations (cached afterwards in %s)", steps, len(pool), out)
    model = _train(load_policy(str(name_or_path)), tokenizer, pool, steps, lr, batch_size, seed)
    return write_recipe(save_pretrained_dir(model, tokenizer, out), recipe)


def demonstrations(records: Sequence[Prompt], off_by_one_share: float, seed: int, tools=None) -> list[Demonstration]:
    """One demonstration per record: its reference solution, a share of them with a planted
    off-by-one slip (seeded), or (tools) a share written with tool calls from the clean record."""
    noise = random.Random(f"{seed}-off-by-one")
    share = getattr(tools, "warmup_share", 0.0) if tools is not None and tools.active else 0.0
    with_tool = random.Random(f"{seed}-tool-demonstrations")
    demos = []
    for r in records:
        slipped = off_by_one(r) if r.answer.isdigit() and noise.random() < off_by_one_share else r
        if share > 0 and with_tool.random() < share:
            demos.append(tool_demonstration(r, tools.call, tools.end, tools.result))
        else:
            demos.append(Demonstration.of(slipped))
    return demos


def _train(model: torch.nn.Module, tokenizer, pool: list[Demonstration], steps: int, lr: float, batch_size: int,
           seed: int) -> torch.nn.Module:
    """`steps` AdamW steps on batches drawn from `pool` (seeded), the lr ramped then cosine-decayed."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    # linear ramp then cosine decay: ending at a small lr leaves a settled model, not one mid-jump
    ramp = min(20, steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (s + 1) / ramp if s < ramp else 0.5 * (1 + math.cos(math.pi * (s - ramp) / max(steps - ramp, 1))),
    )
    rng = random.Random(seed)
    progress = Progress("warm-up", steps, enabled=first_process())
    for step in range(steps):
        ids, attn, labels = sft_batch(tokenizer, rng.sample(pool, min(batch_size, len(pool))))
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        progress.update(step + 1, loss=f"{loss.item():.4f}")
    progress.close()
    return model


def write_recipe(out: Path, recipe: dict | None) -> Path:
    """Record in a warm-up directory the machine-independent recipe it was built from (what
    scripts/ship_start.py ships it under)."""
    if recipe is not None and not (out / RECIPE).is_file():
        (out / RECIPE).write_text(json.dumps({"recipe": recipe, "recipe_key": recipe_key(recipe)}, indent=1))
    return out
