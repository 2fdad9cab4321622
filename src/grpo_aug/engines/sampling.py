"""A lean KV-cached decode loop: all rows in one batch, each with its own temperature.

HF `generate` takes one temperature per call; a group wants one per row, so we sample
ourselves. The loop stops as soon as every row has emitted EOS. For Llama-family models the
per-token forward is `LeanDecoder.step` (preallocated KV buffers, no per-token mask building), or
with static=True `StaticDecoder.step` (fixed shapes, one captured CUDA graph per rollout on a GPU);
other models go through their HF forward with a DynamicCache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import BatchEncoding, DynamicCache, PreTrainedTokenizerBase

from grpo_aug.engines.nucleus import sample_nucleus
from grpo_aug.engines.sampling_options import SamplingOptions, cut_at_stop, filter_probs, penalise_repeats
from grpo_aug.engines.types import Rollout
from grpo_aug.fast_llama.compat import cache_kwargs, keep_last
from grpo_aug.fast_llama.decode import LeanDecoder, sharded, supports
from grpo_aug.fast_llama.forward import stem
from grpo_aug.fast_llama.static_decode import StaticDecoder


def sample_next_token(
    logits: torch.Tensor, temperatures: torch.Tensor, top_p: float, generator: torch.Generator | None = None,
    top_k: int = 0, min_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, V], temperatures [N] (0 = greedy) -> token ids [N] and their log-probs [N].

    After the temperature, min-p and top-k drop tokens (engines/sampling_options.py); then nucleus sampling
    per row keeps the smallest prefix of the sorted distribution whose mass reaches top_p (the
    most likely token always survives), found without a full sort (engines/nucleus.py).
    A token's log-prob is where the trainer scores it: under softmax(logits / T) before any
    filter, at T = 1 for greedy rows. It is read off the probabilities already computed: a
    separate log-softmax over a 49,152-token vocabulary was a tenth of a SmolLM2 decode step.
    """
    temps = temperatures.clamp(min=1e-5).to(logits.dtype)[:, None]  # [N, 1]
    probs = torch.softmax(logits / temps, dim=-1)  # [N, V]
    drawn_from = filter_probs(probs, top_k, min_p) if top_k > 0 or min_p > 0.0 else probs  # [N, V] renormalised
    if top_p < 1.0:
        tokens = sample_nucleus(drawn_from, top_p, generator)  # [N]
    else:
        tokens = torch.multinomial(drawn_from, 1, generator=generator).squeeze(-1)  # [N]
    # a drawn token has probability > 0, so its log is finite
    logprobs = probs.gather(-1, tokens[:, None]).squeeze(-1).log()  # [N]
    greedy_rows = temperatures <= 0  # [N]
    if bool(greedy_rows.any()):  # argmax costs as much as the softmax: only where a row asks for it
        greedy = logits.argmax(dim=-1)  # [N]
        tokens = torch.where(greedy_rows, greedy, tokens)
        greedy_lp = logits.log_softmax(-1).gather(-1, greedy[:, None]).squeeze(-1)  # [N] at T = 1
        logprobs = torch.where(greedy_rows, greedy_lp, logprobs)
    return tokens, logprobs


def encode(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str] | Sequence[Sequence[int]]):
    """Prompts as left-padded input_ids and attention_mask [U, P]: strings through the tokenizer
    (no special tokens added: templates and prompts carry their own), token ids as they are."""
    if all(isinstance(p, str) for p in prompts):
        return tokenizer(list(prompts), return_tensors="pt", padding=True, padding_side="left",
                         add_special_tokens=False)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id, dtype=torch.long)  # [U, P]
    mask = torch.zeros(len(prompts), width, dtype=torch.long)  # [U, P]
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return BatchEncoding({"input_ids": ids, "attention_mask": mask})


def rows_to_keep(running: torch.Tensor) -> torch.Tensor | None:
    """Positions in the decode batch [A'] of the rows still writing ([A] bool), once the ended ones
    are a quarter of the batch; None: not yet. Never empty: a rank whose rows all ended keeps one
    while other ranks decode (their forwards need this rank's)."""
    if int(running.sum()) > 0.75 * len(running):
        return None
    keep = running.nonzero().squeeze(1)  # [A']
    return keep if len(keep) else torch.zeros(1, dtype=torch.long, device=running.device)


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    temperatures: torch.Tensor,
    top_p: float,
    max_new_tokens: int,
    generator: torch.Generator | None = None,
    lean: bool = True,
    all_done: Callable[[bool], bool] | None = None,
    options: SamplingOptions | None = None,
    limits: torch.Tensor | None = None,
    static: bool = False,
) -> Rollout:
    """Sample one completion per prompt (a string, or token ids: a multi-turn transcript so far);
    rows may repeat a prompt (that is a group).

    options: top-k, min-p, repetition penalty and stop strings (engines/sampling_options.py); None: none.
    lean=False forces the HF forward for every token (the reference path the tests compare to).
    all_done: under sharded weights every forward is a collective, so every rank must run the same
    number of decode steps: given this rank's all-finished flag it returns whether every rank's rows
    have finished (a reduced flag); a rank whose rows all ended keeps one row in the batch meanwhile.
    limits: [N] tokens each row may write (<= max_new_tokens); a row that reaches its limit stops
    without EOS (truncated). max_new_tokens stays the loop's bound, the same on every rank.
    static: the lean step at fixed shapes (fast_llama/static_decode.py), replayed as a captured CUDA graph
    on a GPU; the same tokens from the same stream as without. Where the lean step does not apply
    (other models, sharded weights) the HF forward runs as without.
    """
    device = next(model.parameters()).device
    k = options or SamplingOptions()
    was_training = model.training
    model.eval()  # dropout off while sampling
    prompt_ids, prompt_mask, logits, cache, cache_mask, position = prefill(model, tokenizer, prompts, device)
    n, p = prompt_ids.shape
    # allocated once; step t attends to the first P + t columns (a view, no copy per token)
    attn = torch.cat([cache_mask, torch.ones_like(cache_mask[:, :1]).expand(n, max_new_tokens)], dim=1)
    decoder = None
    if lean and supports(model) and not sharded(model):
        new_positions = position + 1 + torch.arange(max_new_tokens, device=device)  # [N, T]
        decoder = (StaticDecoder if static else LeanDecoder)(model, cache, cache_mask, new_positions,
                                                             max_new_tokens)
        if static and device.type == "cuda":
            decoder.capture()
    rows = DecodeRows(prompt_ids, prompt_mask, temperatures.to(device), max_new_tokens, tokenizer, k,
                      None if limits is None else limits.to(device), logits.shape[-1])
    active = torch.arange(n, device=device)  # the rows still in the decode batch
    for step in range(max_new_tokens):
        drawn_from = logits if rows.seen is None else penalise_repeats(logits, rows.seen[active],
                                                                       k.repetition_penalty)
        token, token_lp = sample_next_token(drawn_from, rows.temperatures[active], top_p, generator, k.top_k,
                                            k.min_p)  # [A], [A]
        token = rows.record(step, active, token, token_lp, logits)
        # one host sync per token; it lets the loop end early, which pays for itself
        done_here = bool(rows.halted.all())
        if step == max_new_tokens - 1 or (done_here if all_done is None else all_done(done_here)):
            break
        # rows that ended leave the batch once they are a quarter of it: every later token then
        # costs only the rows still writing
        keep = rows_to_keep(~rows.halted[active])  # [A'] or None: all stay
        if keep is not None:
            active, token = active[keep], token[keep]
            if decoder is not None:
                decoder.select(keep)
            else:
                cache.batch_select_indices(keep)
                attn, position = attn[keep], position[keep]
        if decoder is not None:
            logits = decoder.step(token)
            continue
        position = position + 1
        out = model(input_ids=token[:, None], attention_mask=attn[:, : p + step + 1], position_ids=position,
                    **cache_kwargs(model, cache), use_cache=True)
        logits = out.logits[:, -1].float()
    model.train(was_training)
    return rows.rollout()


def prefill(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
            prompts: Sequence[str] | Sequence[Sequence[int]], device: torch.device):
    """One forward over the distinct prompts (a group repeats its prompt G times: each is encoded
    and prefilled once), its KV cache copied out to every row. When the distinct prompts share a
    long beginning (a system prompt, worked examples: `fast_llama.forward.stem`), that runs once
    first and the rest of each prompt attends to it. Returns the rows' prompt ids and mask [N, P],
    the last position's logits [N, V], the cache, which of its P columns hold a real token [N, P]
    (the prompt mask, or with a stem: the stem's columns, then each prompt's left-padded rest) and
    each row's last position [N, 1]."""
    keys = [p if isinstance(p, str) else tuple(p) for p in prompts]
    distinct = list(dict.fromkeys(keys))
    row_of = {key: i for i, key in enumerate(distinct)}
    index = torch.tensor([row_of[key] for key in keys], device=device)  # [N] row -> distinct prompt
    enc = encode(tokenizer, distinct)
    ids, mask = enc.input_ids.to(device), enc.attention_mask.to(device)  # [U, P]
    # the stem's extra forward is a collective under sharded weights: only where the lean paths run
    s = stem(ids, mask.bool()) if supports(model) and not sharded(model) else 0
    cache = DynamicCache()
    if s:
        start = int(ids.shape[1] - mask[0].sum())  # the first prompt's real tokens begin here
        model(input_ids=ids[:1, start : start + s], position_ids=torch.arange(s, device=device)[None],
              use_cache=True, logits_to_keep=keep_last(model, 1, s), **cache_kwargs(model, cache))
        for layer in cache.layers:  # [1, KV, S, D] -> [U, KV, S, D]
            layer.keys, layer.values = (z.expand(len(ids), -1, -1, -1) for z in (layer.keys, layer.values))
        # a prompt of L real tokens keeps columns P - L + S .. P - 1 after its stem; a grid S narrower
        # holds them at P - L .. P - S - 1, left-padded as before: its mask is the old one's first P - S columns
        rest, rest_mask = ids[:, s:], mask[:, : ids.shape[1] - s]  # [U, P - S]
        cache_mask = torch.cat([mask.new_ones(len(ids), s), rest_mask], dim=1)  # [U, P]
        position = s + (rest_mask.cumsum(-1) - 1).clamp(min=0)  # [U, P - S]
        out = model(input_ids=rest, attention_mask=cache_mask, position_ids=position, use_cache=True,
                    logits_to_keep=keep_last(model, 1, rest.shape[1]), **cache_kwargs(model, cache))
    else:
        cache_mask = mask
        position = (mask.cumsum(-1) - 1).clamp(min=0)  # [U, P] left padding shifts positions
        out = model(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=True,
                    logits_to_keep=keep_last(model, 1, ids.shape[1]), **cache_kwargs(model, cache))
    logits = out.logits[:, -1].float()[index]  # [N, V] only the last position's logits were computed
    for layer in cache.layers:  # the distinct prompts' keys/values, one copy per row
        layer.keys, layer.values = layer.keys[index], layer.values[index]  # [N, KV, P, D]
    return ids[index], mask[index], logits, cache, cache_mask[index], position[index, -1:]


class DecodeRows:
    """What the decode loop writes for every row, whichever rows are still in its batch: the
    tokens, their log-probs, which rows ended (EOS, a stop string, their own limit)."""

    def __init__(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, temperatures: torch.Tensor,
                 max_new_tokens: int, tokenizer: PreTrainedTokenizerBase, options: SamplingOptions,
                 limits: torch.Tensor | None, vocab: int) -> None:
        n, device = prompt_ids.shape[0], prompt_ids.device
        self.prompt_ids, self.prompt_mask, self.temperatures = prompt_ids, prompt_mask, temperatures  # [N, P] [N]
        self.tokenizer, self.options, self.limits = tokenizer, options, limits
        self.eos, self.pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        self.finished = torch.zeros(n, dtype=torch.bool, device=device)  # EOS or a stop string
        self.halted = torch.zeros(n, dtype=torch.bool, device=device)  # finished, or at its own limit
        self.stopped = torch.zeros(n, dtype=torch.bool, device=device)  # ended by a stop string
        self.seen = None
        if options.repetition_penalty != 1.0:  # [N, V] the tokens of each row's prompt, and later its completion
            counts = torch.zeros(n, vocab, dtype=torch.long, device=device)
            self.seen = counts.scatter_add_(1, prompt_ids, prompt_mask.long()) > 0
        self.completion = torch.full((n, max_new_tokens), self.pad, dtype=prompt_ids.dtype, device=device)  # [N, T]
        self.sample_lp = torch.zeros(n, max_new_tokens, dtype=torch.float32, device=device)  # [N, T]
        self.scored_at = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures)).float()  # [N]
        self.alive = torch.zeros(n, max_new_tokens, dtype=torch.bool, device=device)  # [N, T]
        self.steps = 0

    def record(self, step: int, active: torch.Tensor, token: torch.Tensor, token_lp: torch.Tensor,
               logits: torch.Tensor) -> torch.Tensor:
        """Write step `step`'s tokens of the rows `active` ([A] each; a row that ended earlier
        writes padding); returns the tokens as written."""
        done = self.halted[active]  # ended earlier, not yet dropped from the batch
        token = torch.where(done, torch.full_like(token, self.pad), token)
        self.completion[active, step] = token
        if self.seen is not None:  # drawn from penalised logits; the trainer scores the model's own
            token_lp = (logits / self.scored_at[active, None]).log_softmax(-1).gather(-1, token[:, None])[:, 0]
        self.sample_lp[active, step] = torch.where(done, 0.0, token_lp)
        self.alive[active, step] = ~done
        self.finished[active] = self.finished[active] | (~done & (token == self.eos))
        if self.seen is not None:
            self.seen[active[~done], token[~done]] = True
        self._stop_strings(step, active)
        self.halted |= self.finished
        if self.limits is not None:
            self.halted |= self.limits <= step + 1
        self.steps = step + 1
        return token

    def _stop_strings(self, step: int, active: torch.Tensor) -> None:
        """Rows whose newest token completed a stop string end here."""
        k = self.options
        running = active[~(self.finished | self.halted)[active]] if k.stop else active[:0]  # [R]
        if len(running):
            tails = self.tokenizer.batch_decode(self.completion[running, max(0, step + 1 - k.stop_window) : step + 1],
                                                skip_special_tokens=True)
            hit = torch.tensor([any(s in t for s in k.stop) for t in tails], dtype=torch.bool,
                               device=running.device)
            self.finished[running[hit]] = self.stopped[running[hit]] = True

    def rollout(self) -> Rollout:
        steps = self.steps
        completion = self.completion[:, :steps]  # [N, T]
        completion_mask = self.alive[:, :steps].to(self.prompt_mask.dtype)  # [N, T]
        texts = self.tokenizer.batch_decode(completion, skip_special_tokens=True)
        for i in self.stopped.nonzero().flatten().tolist():
            texts[i] = cut_at_stop(texts[i], self.options.stop, self.options.include_stop)[0]
        return Rollout(
            input_ids=torch.cat([self.prompt_ids, completion], dim=1),  # [N, P + T]
            attention_mask=torch.cat([self.prompt_mask, completion_mask], dim=1),  # [N, P + T]
            completion_mask=completion_mask,
            temperatures=self.temperatures,
            prompt_len=self.prompt_ids.shape[1],
            texts=texts,
            truncated=~self.finished,
            sample_logprobs=self.sample_lp[:, :steps] * completion_mask,
        )
