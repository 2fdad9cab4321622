"""Where a decode step's time goes on the *small* workload of trainer_step.py (prints JSON).

    python benchmarks/decode_step.py

For a batch of A rows, one lean decode step (`grpo_aug.fast_llama.decode.LeanDecoder.step`) is timed
against the matmuls it cannot avoid: each layer's q/k/v, output, gate/up and down projections at
A rows, run layer after layer as decoding does, so every weight is read back from memory once per
token. `weight_gb_per_s` is the weight bytes those matmuls read per second. With few rows a step
moves the whole model through the caches to produce A tokens, and the products run far below
both the FLOP rate that `trainer_step.py` reports its share of and this machine's memory
bandwidth (~33 GB/s from DRAM): the small-M GEMM kernels' cost per call sets the pace.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from trainer_step import build_model, median_seconds  # noqa: E402

PROMPT, TOKENS_BEFORE = 6, 20  # a step after 20 generated tokens, as in the middle of a rollout


def main() -> None:
    from transformers import AutoModelForCausalLM, DynamicCache

    from grpo_aug.fast_llama.decode import LeanDecoder

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        model = AutoModelForCausalLM.from_pretrained(build_model("small", Path(tmp) / "model")).eval()
    weights = []  # per layer, [in, out] as the decode step holds them
    for layer in model.model.layers:
        a, mlp = layer.self_attn, layer.mlp
        weights.append([torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).t().contiguous(),
                        a.o_proj.weight.t().contiguous(),
                        torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t().contiguous(),
                        mlp.down_proj.weight.t().contiguous()])
    weight_bytes = sum(w.numel() * w.element_size() for ws in weights for w in ws)
    rows = []
    for a_rows in (64, 32, 16, 8, 4, 1):
        ids = torch.randint(5, 19, (a_rows, PROMPT))
        mask = torch.ones_like(ids)
        cache = DynamicCache()
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=torch.arange(PROMPT).expand(a_rows, -1),
                  cache=cache, use_cache=True)
        steps = TOKENS_BEFORE + 40
        decoder = LeanDecoder(model, cache, mask, PROMPT + torch.arange(steps).expand(a_rows, -1), steps)
        token = torch.randint(5, 19, (a_rows,))
        for _ in range(TOKENS_BEFORE):
            decoder.step(token)
        step_s = median_seconds(lambda: decoder.step(token), 30, warmup=3)
        x = {w.shape[0]: torch.randn(a_rows, w.shape[0]) for ws in weights for w in ws}

        def matmuls(layers):
            for ws in layers:
                for w in ws:
                    x[w.shape[0]] @ w

        streamed = median_seconds(lambda: matmuls(weights), 30, warmup=3)  # every layer: weights leave the cache
        cached = median_seconds(lambda: matmuls([weights[0]] * len(weights)), 30, warmup=3)  # one layer's weights, hot
        flops = 2 * a_rows * weight_bytes / 4
        rows.append({"rows": a_rows, "decode_step_ms": step_s * 1e3, "matmuls_ms": streamed * 1e3,
                     "matmuls_one_layer_cached_ms": cached * 1e3, "weight_gb_per_s": weight_bytes / streamed / 1e9,
                     "matmul_gflops": flops / streamed / 1e9})
    print(json.dumps({"model": "small (6 x 256, fp32)", "weight_mb": weight_bytes / 1e6, "steps": rows}, indent=2))


if __name__ == "__main__":
    main()
