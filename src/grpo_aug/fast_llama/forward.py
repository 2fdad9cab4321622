"""A packed forward for scoring completions with Llama-family models: the HF math, without padding.

A scoring batch is mostly padding and repetition: the G rows of a group share their prompt, and
rows end at different lengths, so a padded [N, P + T] block holds far more tokens than were
written. Here every position-wise step (norms, q/k/v, output and MLP projections, the vocabulary
projection) runs on a packed matrix of the real tokens only: each distinct prompt's tokens once,
then each row's completion tokens up to where it ended. Only attention goes back to a padded
layout: the prompts attend causally among themselves; each completion attends to its own prompt's
keys/values (indexed out to the row, so gradients add up over the group) and causally to itself.
Distinct prompts often share a long beginning too (a system prompt, worked examples): when that
stem is at least STEM_FROM tokens it runs once, and every prompt's remaining tokens and every
completion attend to its keys/values as well.
`tests/unit/test_fast_llama_forward.py` checks logits and gradients against the HF forward.

Reading weights directly is not possible when a strategy shards them (FSDP, DeepSpeed ZeRO-3),
and this forward keeps every activation, so a model set up for gradient checkpointing keeps its
own: in both cases `packable` says no and the caller uses the HF forward.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from grpo_aug.algo.chunks import length_chunks
from grpo_aug.fast_llama.compat import activation_checkpointing
from grpo_aug.fast_llama.decode import FUSE_BELOW_HIDDEN, rms_norm, sharded, supports
from grpo_aug.fast_llama.vocab_logprobs import vocab_logprobs

ATTENTION_SAVING = 0.3  # group completions for attention when that saves more than this share
# a shared beginning of the distinct prompts runs once from this many tokens: below it the tokens
# saved are few, and the default run's prompts (a character each, no shared beginning) keep the
# layout their numbers were measured with
STEM_FROM = 16


def packable(model: torch.nn.Module) -> bool:
    return supports(model) and not sharded(model) and not activation_checkpointing(model)


def _residual(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x + h @ weight.T (+ bias), the add fused into the matmul when there is no bias."""
    if bias is None:
        return torch.addmm(x, h, weight.t())
    return x + F.linear(h, weight, bias)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [M, heads, D]; cos/sin [M, 1, D]."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def _unpack(flat: torch.Tensor, index: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """flat [M, heads, D] at positions `index` of a [rows * length] grid -> [rows, heads, length, D]."""
    grid = flat.new_zeros(rows * length, *flat.shape[1:]).index_copy(0, index, flat)  # [rows*L, heads, D]
    return grid.view(rows, length, *flat.shape[1:]).transpose(1, 2)


def _pack(grid: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[rows, heads, L, D] -> [M, heads * D] at positions `index`."""
    rows, heads, length, d = grid.shape
    return grid.transpose(1, 2).reshape(rows * length, heads * d).index_select(0, index)


class _TailGroup(NamedTuple):
    """Rows whose completions attend together, in a grid as long as their longest."""

    prompt_of: torch.Tensor  # [n] each row's distinct prompt
    t: int  # grid length
    index: torch.Tensor  # [m] the real tokens' places in the [n * t] grid, in packed order
    mask: torch.Tensor  # [n, t, P + t] True = visible (own prompt's real tokens, then causal)


def attention_groups(lengths: torch.Tensor, prompt_len: int, count: int) -> list[torch.Tensor]:
    """Rows in `count` length-sorted groups when that saves over ATTENTION_SAVING of the attention
    work (rows x length x (prompt + length)), else one group. Matmuls see only real tokens anyway;
    attention runs on padded grids, and one long row would make every row pay for its length."""
    one = [torch.arange(len(lengths), device=lengths.device)]
    if count <= 1 or len(lengths) < count:
        return one
    groups = length_chunks(lengths, count)

    def work(rows_list):
        return sum(len(r) * int(lengths[r].max()) * (prompt_len + int(lengths[r].max())) for r in rows_list)

    whole = work(one)
    return groups if whole and 1 - work(groups) / whole > ATTENTION_SAVING else one


def stem_length(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> int:
    """How many first real tokens every distinct prompt ([U, P], left-padded) shares, leaving each at
    least one of its own (its last token predicts the completion); 0 for one prompt."""
    lengths = prompt_mask.sum(-1)  # [U]
    shortest = int(lengths.min())
    if len(prompt_ids) < 2 or shortest < 2:
        return 0
    starts = prompt_ids.shape[1] - lengths  # [U] left padding
    cols = starts[:, None] + torch.arange(shortest - 1, device=prompt_ids.device)  # [U, L-1]
    first = prompt_ids.gather(1, cols)  # [U, L-1] each prompt's real tokens from its start
    same = (first == first[:1]).all(0)  # [L-1]
    return int(same.long().cumprod(0).sum())


def stem(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> int:
    """The shared beginning worth running once: `stem_length` when it reaches STEM_FROM, else 0."""
    s = stem_length(prompt_ids, prompt_mask)
    return s if s >= STEM_FROM else 0


class _Layout:
    """Where the real tokens sit: `index_*` into the padded grids, masks for attention. Packed order:
    the stem's s tokens (the distinct prompts' shared beginning; s = 0 without one), the prompts'
    remaining mp tokens, then the completions'."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int,
                 length_groups: int) -> None:
        p = prompt_len
        mask = attention_mask.bool()  # [N, P+T]
        distinct, self.row_prompt = torch.unique(torch.cat([input_ids[:, :p], attention_mask[:, :p]], 1), dim=0,
                                                 return_inverse=True)  # [U, 2P], [N]
        prompt_ids, prompt_mask = distinct[:, :p], distinct[:, p:].bool()  # [U, P]
        dev = input_ids.device
        self.s = s = stem(prompt_ids, prompt_mask)
        start = int(p - prompt_mask.sum(-1)[0])  # where the first distinct prompt's real tokens begin
        stem_ids = prompt_ids[0, start : start + s]  # [S]
        # what is left of each prompt after the stem, still left-padded: a prompt of L real tokens
        # keeps columns P - L + S .. P - 1, which land at P - L .. P - S - 1 of a grid S narrower, so
        # the grid's mask is the first P - S columns of the old one
        self.prompt_ids, prompt_mask = prompt_ids[:, s:], prompt_mask[:, : p - s]  # [U, P'] P' = P - S
        self.u, self.n, self.p = len(distinct), len(input_ids), p - s
        self.t = input_ids.shape[1] - p - 1  # completion tokens that are inputs (the last one only a target)
        tail_mask = mask[:, p : p + self.t]  # [N, T'] a prefix of each row: completions are right-padded
        self.index_prompt = prompt_mask.flatten().nonzero().squeeze(1)  # [Mp] into [U*P']
        self.mp = len(self.index_prompt)
        prompt_pos = s + (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)  # [U, P'] left padding shifts positions
        # the last prompt token is real (left padding), so it is the last packed token of its prompt
        self.last_prompt = s + prompt_mask.long().sum(-1).cumsum(0) - 1  # [U] into the packed tokens
        # keys a prompt's tokens see: the stem's, then its own [U, S + P']
        seen = torch.cat([prompt_mask.new_ones(self.u, s), prompt_mask], -1)
        causal_p = torch.ones(self.p, self.p, dtype=torch.bool, device=dev).tril()
        # a padding query sees only itself (zero key and value) and the stem: finite, and never read
        eye = torch.eye(self.p, dtype=torch.bool, device=dev)
        own = (causal_p & prompt_mask[:, None, :]) | eye  # [U, P', P']
        self.mask_prompt = torch.cat([seen[:, None, :s].expand(-1, self.p, -1), own], -1)  # [U, P', S + P']
        self.mask_stem = torch.ones(s, s, dtype=torch.bool, device=dev).tril()[None]  # [1, S, S]
        # completion tokens are packed group by group (rows of similar length, see attention_groups)
        self.groups: list[_TailGroup] = []
        grid_index = []  # each packed completion token's place in the [N, T'] grid
        for rows in attention_groups(tail_mask.sum(-1), p, length_groups):
            t = int(tail_mask[rows].sum(-1).max()) if len(rows) else 0
            if t == 0:
                continue
            index = tail_mask[rows, :t].flatten().nonzero().squeeze(1)  # [m] into [n*t]
            causal = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
            prompt_of = self.row_prompt[rows]  # [n]
            mask_g = torch.cat([seen[prompt_of, None, :].expand(-1, t, -1), causal.expand(len(rows), -1, -1)],
                               dim=-1)  # [n, t, S + P' + t]
            self.groups.append(_TailGroup(prompt_of, t, index, mask_g))
            grid_index.append((rows[:, None] * self.t + torch.arange(t, device=dev)).flatten()[index])
        self.index_tail = torch.cat(grid_index) if grid_index else torch.zeros(0, dtype=torch.long, device=dev)
        tail_pos = prompt_pos[self.row_prompt, -1:] + 1 + torch.arange(self.t, device=dev)  # [N, T']
        self.ids = torch.cat([stem_ids, self.prompt_ids.flatten()[self.index_prompt],
                              input_ids[:, p : p + self.t].flatten()[self.index_tail]])  # [M]
        self.positions = torch.cat([torch.arange(s, device=dev), prompt_pos.flatten()[self.index_prompt],
                                    tail_pos.flatten()[self.index_tail]])


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, Hq, L, D], k/v [B, KV, S, D], mask [B, L, S] (True = visible) -> [B, Hq, L, D]."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


def _layer(layer: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lay: _Layout,
           d: int) -> torch.Tensor:
    """One decoder layer on packed tokens x [M, H]."""
    a, mlp = layer.self_attn, layer.mlp
    h = rms_norm(x, layer.input_layernorm)  # [M, H]
    if x.shape[-1] < FUSE_BELOW_HIDDEN:
        # few, small matmuls: one call each for q/k/v and gate/up is faster; the concatenated
        # weights are kept for backward, a copy that only narrow models can afford
        w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])  # [(Hq+2KV)*D, H]
        b = None if a.q_proj.bias is None else torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
        q, k, v = F.linear(h, w, b).split(
            [a.q_proj.out_features, a.k_proj.out_features, a.v_proj.out_features], -1)
    else:
        q, k, v = a.q_proj(h), a.k_proj(h), a.v_proj(h)
    q = _rope(q.view(len(x), -1, d), cos, sin)  # [M, Hq, D]
    k = _rope(k.view(len(x), -1, d), cos, sin)  # [M, KV, D]
    v = v.view(len(x), -1, d)  # [M, KV, D]
    s, mp = lay.s, lay.mp
    outs = []
    qp, kp, vp = (_unpack(z[s : s + mp], lay.index_prompt, lay.u, lay.p) for z in (q, k, v))  # [U, heads, P', D]
    if s:
        qs, ks, vs = (z[:s].transpose(0, 1)[None] for z in (q, k, v))  # [1, heads, S, D]
        outs.append(_attend(qs, ks, vs, lay.mask_stem, a.scaling)[0].transpose(0, 1).flatten(1))  # [S, Hq*D]
        # every prompt sees the stem first; expand's backward adds the prompts' gradients up
        kp = torch.cat([ks.expand(lay.u, -1, -1, -1), kp], dim=2)  # [U, KV, S + P', D]
        vp = torch.cat([vs.expand(lay.u, -1, -1, -1), vp], dim=2)
    outs.append(_pack(_attend(qp, kp, vp, lay.mask_prompt, a.scaling), lay.index_prompt))  # [Mp, Hq*D]
    start = s + mp
    for g in lay.groups:
        end = start + len(g.index)
        qt, kt, vt = (_unpack(z[start:end], g.index, len(g.prompt_of), g.t) for z in (q, k, v))  # [n, heads, t, D]
        # index_select, not kp[prompt_of]: a prompt repeats across its group's rows, and indexing's
        # backward adds those rows' gradients with parallel atomic adds on a CPU (an order that
        # varies from run to run); index_select's backward sums them in a fixed order
        kt = torch.cat([kp.index_select(0, g.prompt_of), kt], dim=2)  # [n, KV, S + P' + t, D]
        vt = torch.cat([vp.index_select(0, g.prompt_of), vt], dim=2)
        outs.append(_pack(_attend(qt, kt, vt, g.mask, a.scaling), g.index))  # [m, Hq*D]
        start = end
    out = torch.cat(outs)  # [M, Hq*D]
    x = _residual(x, out, a.o_proj.weight, a.o_proj.bias)  # [M, H]
    h = rms_norm(x, layer.post_attention_layernorm)
    if x.shape[-1] < FUSE_BELOW_HIDDEN and mlp.gate_proj.bias is None:
        gate, up = F.linear(h, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])).chunk(2, dim=-1)  # [M, I]
    else:
        gate, up = mlp.gate_proj(h), mlp.up_proj(h)
    return _residual(x, mlp.act_fn(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)  # [M, H]


def _packed_states(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   prompt_len: int, length_groups: int) -> tuple[torch.Tensor, _Layout]:
    """The final-norm hidden states [U + Mt, H] where a completion token is predicted: each distinct
    prompt's last token, then the completion tokens in packed order."""
    lay = _Layout(input_ids, attention_mask, prompt_len, length_groups)
    core = model.model
    x = core.embed_tokens(lay.ids)  # [M, H]
    cos, sin = core.rotary_emb(x, lay.positions[None])  # [1, M, D]
    cos, sin = cos[0, :, None].to(x.dtype), sin[0, :, None].to(x.dtype)  # [M, 1, D]
    d = core.layers[0].self_attn.head_dim
    for layer in core.layers:
        x = _layer(layer, x, cos, sin, lay, d)
    wanted = torch.cat([x[lay.last_prompt], x[lay.s + lay.mp :]])  # [U + Mt, H], completion tokens in packed order
    return rms_norm(wanted, core.norm), lay


def packed_completion_logits(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                             prompt_len: int, length_groups: int = 1) -> torch.Tensor:
    """Logits [N, T, V] predicting each completion token (zeros where the input token is padding).

    input_ids/attention_mask: [N, P + T], prompts left-padded to P, completions right-padded.
    length_groups: completions attend in up to this many length-sorted groups (`attention_groups`).
    """
    states, lay = _packed_states(model, input_ids, attention_mask, prompt_len, length_groups)
    logits = model.lm_head(states)  # [U + Mt, V] the vocabulary projection only where a token is predicted
    first = logits[: lay.u].index_select(0, lay.row_prompt)[:, None]  # [N, 1, V] (index_select: see _layer)
    tail = logits.new_zeros(lay.n * lay.t, logits.shape[-1]).index_copy(0, lay.index_tail, logits[lay.u :])
    return torch.cat([first, tail.view(lay.n, lay.t, logits.shape[-1])], dim=1)  # [N, T, V]


def packed_completion_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                               prompt_len: int, temperatures: torch.Tensor, length_groups: int = 1,
                               with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p of each completion token [N, T] at its row's temperature (> 0), and with_entropy the
    entropies [N, T]; 0 where no real token predicts the position (padding: the caller masks it).
    The vocabulary's logits exist one block of tokens at a time (fast_llama/vocab_logprobs.py)."""
    states, lay = _packed_states(model, input_ids, attention_mask, prompt_len, length_groups)
    n, t = lay.n, lay.t + 1  # t: every completion column, the first predicted by the prompt
    rows = torch.arange(n, device=input_ids.device)  # [N]
    # where each prediction lands in the [N, T] grid: column 0 from the prompt, then the tail's
    places = torch.cat([rows * t, lay.index_tail // lay.t * t + lay.index_tail % lay.t + 1]) if lay.t \
        else rows * t  # [N + Mt]
    states = torch.cat([states[: lay.u].index_select(0, lay.row_prompt), states[lay.u :]])  # [N + Mt, H]
    targets = input_ids[:, prompt_len:].flatten()[places]  # [N + Mt]
    temps = temperatures.to(states.device)[places // t]  # [N + Mt]
    logps, entropy = vocab_logprobs(states, model.lm_head.weight, targets, temps, with_entropy)
    grid = logps.new_zeros(n * t)

    def spread(values: torch.Tensor) -> torch.Tensor:
        return grid.index_copy(0, places, values).view(n, t)  # [N, T]

    return spread(logps), (None if entropy is None else spread(entropy))
