"""Concatenate rollouts of different shapes and select rows, keeping the padding conventions."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from grpo_aug.engines.types import Rollout


def concat_rollouts(parts: Sequence[Rollout], pad_id: int) -> Rollout:
    """Rows of all parts; prompts re-left-padded to the longest P, completions right-padded to T."""
    P = max(r.prompt_len for r in parts)
    T = max(r.completion_mask.shape[1] for r in parts)
    ids, attn, cmask = [], [], []
    for r in parts:
        n, t = r.completion_mask.shape
        left, right = P - r.prompt_len, T - t
        ids.append(torch.nn.functional.pad(r.input_ids, (left, right), value=pad_id))  # [n, P + T]
        attn.append(torch.nn.functional.pad(r.attention_mask, (left, right), value=0))
        cmask.append(torch.nn.functional.pad(r.completion_mask, (0, right), value=0))  # [n, T]
    return Rollout(
        input_ids=torch.cat(ids),
        attention_mask=torch.cat(attn),
        completion_mask=torch.cat(cmask),
        temperatures=torch.cat([r.temperatures for r in parts]),
        prompt_len=P,
        texts=[t for r in parts for t in r.texts],
        truncated=torch.cat([r.truncated for r in parts]),
        sample_logprobs=None if any(r.sample_logprobs is None for r in parts) else torch.cat(
            [torch.nn.functional.pad(r.sample_logprobs, (0, T - r.completion_mask.shape[1])) for r in parts]),
        given=None if all(r.given is None for r in parts) else torch.cat(
            [torch.nn.functional.pad(_given(r), (0, T - r.completion_mask.shape[1])) for r in parts]),
        tool_calls=None if all(r.tool_calls is None for r in parts) else torch.cat(
            [_calls(r, "tool_calls") for r in parts]),
        tool_failures=None if all(r.tool_failures is None for r in parts) else torch.cat(
            [_calls(r, "tool_failures") for r in parts]),
        segments=None if all(r.segments is None for r in parts) else [
            s for r in parts for s in (r.segments or [[("policy", t)] for t in r.texts])],
        env_rewards=None if all(r.env_rewards is None for r in parts) else torch.cat(
            [torch.full((len(r.texts),), math.nan, device=r.input_ids.device) if r.env_rewards is None
             else r.env_rewards for r in parts]),
    )


def _calls(ro: Rollout, name: str) -> torch.Tensor:
    value = getattr(ro, name)
    return torch.zeros(len(ro.texts), dtype=torch.long, device=ro.input_ids.device) if value is None else value


def _given(ro: Rollout) -> torch.Tensor:
    return torch.zeros_like(ro.completion_mask, dtype=torch.bool) if ro.given is None else ro.given


def select_rows(ro: Rollout, rows: torch.Tensor) -> Rollout:
    """The rollout restricted to `rows` (a 1-D index tensor), in that order."""
    index = rows.tolist()
    return Rollout(
        input_ids=ro.input_ids[rows],
        attention_mask=ro.attention_mask[rows],
        completion_mask=ro.completion_mask[rows],
        temperatures=ro.temperatures[rows],
        prompt_len=ro.prompt_len,
        texts=[ro.texts[i] for i in index],
        truncated=ro.truncated[rows],
        sample_logprobs=None if ro.sample_logprobs is None else ro.sample_logprobs[rows],
        given=None if ro.given is None else ro.given[rows],
        tool_calls=None if ro.tool_calls is None else ro.tool_calls[rows],
        tool_failures=None if ro.tool_failures is None else ro.tool_failures[rows],
        segments=None if ro.segments is None else [ro.segments[i] for i in index],
        env_rewards=None if ro.env_rewards is None else ro.env_rewards[rows],
    )


def replace_rows(ro: Rollout, rows: torch.Tensor, fresh: Rollout, pad_id: int) -> Rollout:
    """`ro` with row rows[i] replaced by fresh row i (shapes re-padded as needed)."""
    order = torch.arange(len(ro.texts))
    order[rows.cpu()] = len(ro.texts) + torch.arange(len(rows))
    return select_rows(concat_rollouts([ro, fresh], pad_id), order.to(ro.input_ids.device))


def trim(ro: Rollout) -> Rollout:
    """Drop completion columns in which no row is still generating (padding only)."""
    used = ro.completion_mask.any(dim=0).nonzero()
    t = int(used[-1]) + 1 if len(used) else 1
    if t == ro.completion_mask.shape[1]:
        return ro
    return ro._replace(input_ids=ro.input_ids[:, : ro.prompt_len + t],
                       attention_mask=ro.attention_mask[:, : ro.prompt_len + t],
                       completion_mask=ro.completion_mask[:, :t],
                       sample_logprobs=None if ro.sample_logprobs is None else ro.sample_logprobs[:, :t],
                       given=None if ro.given is None else ro.given[:, :t])


def spread_rows(ro: Rollout, counts: Sequence[int], width: int) -> tuple[Rollout, torch.Tensor]:
    """Groups of counts[b] consecutive rows laid out `width` slots each, and present [B, width].

    A missing slot holds a copy of its group's first row without completion tokens or text, so
    that every tensor keeps its [B * width] layout; `present` marks it, and nothing downstream
    scores, counts or trains it."""
    index, present, start = [], [], 0
    for count in counts:
        index += list(range(start, start + count)) + [start] * (width - count)
        present += [True] * count + [False] * (width - count)
        start += count
    device = ro.input_ids.device
    out = select_rows(ro, torch.tensor(index, device=device))
    here = torch.tensor(present, device=device)  # [B*width]
    P = ro.prompt_len
    attention = out.attention_mask.clone()
    attention[:, P:] *= here[:, None].to(attention.dtype)
    return out._replace(
        attention_mask=attention,
        completion_mask=out.completion_mask * here[:, None].to(out.completion_mask.dtype),
        texts=[t if h else "" for t, h in zip(out.texts, present, strict=True)],
        truncated=out.truncated & here.to(out.truncated.device),
        tool_calls=None if out.tool_calls is None else out.tool_calls * here.to(out.tool_calls.device),
        tool_failures=None if out.tool_failures is None else out.tool_failures * here.to(out.tool_failures.device),
        segments=None if out.segments is None else [s if h else [] for s, h in zip(out.segments, present, strict=True)],
        env_rewards=None if out.env_rewards is None else out.env_rewards.masked_fill(
            ~here.to(out.env_rewards.device), math.nan),
    ), here.view(len(counts), width)
