"""The lean decode step at fixed shapes, replayed as one captured CUDA graph per rollout.

On a GPU a decode step of a small model is a few hundred tiny kernels: their launches, not the
math, set the pace (issue 50 measured 18 ms per step at 270M parameters on an H200, about 1% of
the hardware). A CUDA graph launches them all at once, but it replays fixed shapes and fixed
addresses. So this step differs from `LeanDecoder.step` in three ways:

- every row stays in the batch to the end: a row that finished is fed a stand-in token and its
  logits are dropped (the loop still samples only its active rows, so the random stream draws
  what the eager loop draws);
- each token attends over the whole key/value buffer [P + T], the columns not yet written masked
  out (the buffers start at zero, so a masked column adds exactly 0);
- the position is a tensor on the device, advanced outside the graph.

On a CPU the same step runs eagerly: tests/unit/test_static_decode.py checks it token for token
against the eager loop. `capture()` records it on CUDA; scripts/gpu_check.py compares the replay
with the eager loop there.
"""

from __future__ import annotations

import torch

from grpo_aug.fast_llama.decode import LeanDecoder, rms_norm


class StaticDecoder(LeanDecoder):
    def __init__(self, model: torch.nn.Module, cache, prompt_mask: torch.Tensor, positions: torch.Tensor,
                 max_new_tokens: int) -> None:
        super().__init__(model, cache, prompt_mask, positions, max_new_tokens)
        for k, v in zip(self.keys, self.values, strict=True):
            k[:, :, self.p :] = 0  # unwritten columns are read (and masked): no NaN from stale memory
            v[:, :, self.p :] = 0
        device = self.keys[0].device
        n, total = self.bias.shape[0], self.bias.shape[-1]
        self.columns = torch.arange(total, device=device)  # [P+T]
        self.t_now = torch.zeros((), dtype=torch.long, device=device)  # the step, advanced outside the graph
        self.tokens = torch.zeros(n, dtype=torch.long, device=device)  # [N] the graph's input
        self.logits: torch.Tensor | None = None  # [N, V] the graph's output
        self.graph = None
        self.active = torch.arange(n, device=device)  # [A] the rows the loop still decodes, in its order

    def select(self, keep: torch.Tensor) -> None:
        """Keep only rows `keep` [A'] (indices into the active rows) from now on: at fixed shapes
        the rows that ended stay in the batch, fed a stand-in, and their logits are not returned."""
        self.active = self.active[keep]

    def _step(self) -> torch.Tensor:
        """One token for every row from self.tokens at position P + t_now: logits [N, V]."""
        n, d = self.tokens.shape[0], self.head_dim
        at = self.t_now + self.p  # [] on the device
        cos = self.cos.index_select(1, self.t_now.view(1))  # [N, 1, D]
        sin = self.sin.index_select(1, self.t_now.view(1))  # [N, 1, D]
        bias = self.bias.masked_fill(self.columns > at, torch.finfo(self.bias.dtype).min)  # [N, 1, 1, P+T]
        where = at.view(1)
        x = self.model.model.embed_tokens(self.tokens)  # [N, H]
        for i, (layer, proj) in enumerate(zip(self.layers, self.projections, strict=True)):
            qkv = proj.qkv(rms_norm(x, layer.input_layernorm)).view(n, -1, d)  # [N, Hq+2KV, D]
            qk = self._rope(qkv[:, : self.heads + self.kv_heads], cos, sin)  # [N, Hq+KV, D]
            # cast as the eager step's slice assignment does (under autocast q/k/v come out bf16)
            self.keys[i].index_copy_(2, where, qk[:, self.heads :, None].to(self.keys[i].dtype))  # [N, KV, P+T, D]
            self.values[i].index_copy_(2, where, qkv[:, self.heads + self.kv_heads :, None].to(self.values[i].dtype))
            q = qk[:, : self.heads].view(n, self.kv_heads, -1, d)  # [N, KV, groups, D]
            scores = q @ self.keys[i].transpose(-1, -2) + bias  # [N, KV, groups, P+T]
            out = torch.softmax(scores, dim=-1) @ self.values[i]  # [N, KV, groups, D]
            x = proj.out(x, out.reshape(n, -1))  # [N, H]
            x = proj.mlp_residual(x, rms_norm(x, layer.post_attention_layernorm))
        return self.model.lm_head(rms_norm(x, self.model.model.norm)).float()  # [N, V]

    def capture(self) -> None:
        """Record the step as a CUDA graph (CUDA only). The warm-up runs write position P's keys
        and values, which the first real step writes again. Under autocast (bf16-mixed) the casts
        are recorded too: autocast's weight cache must be off while capturing (torch's CUDA graph
        notes), so the graph never reads a cached cast that the context frees."""
        autocast = torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"),
                                  enabled=torch.is_autocast_enabled("cuda"), cache_enabled=False)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), autocast:
            for _ in range(2):  # kernels pick their algorithms and allocate outside the capture
                self._step()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), autocast:
            self.logits = self._step()

    @torch.no_grad()
    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Feed token [A] of the active rows at the next position; logits [A, V]."""
        self.tokens.zero_()
        self.tokens.index_copy_(0, self.active, token)
        if self.graph is not None:
            self.graph.replay()
            logits = self.logits
        else:
            logits = self._step()
        self.t_now += 1
        self.t += 1
        return logits.index_select(0, self.active)
