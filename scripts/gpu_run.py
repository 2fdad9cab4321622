"""A 20-step GRPO run on one GPU with a random-weight Qwen2-style model of about 0.5B shape
(24 layers x 896 hidden, 14 heads, 2 KV heads), bf16 autocast, LoRA, and the vLLM engine where
vLLM is installed. Prints step time, generated tokens per second and peak GPU memory as JSON.

    python scripts/gpu_run.py --steps 20 [--no-vllm]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]


def build(out: Path) -> tuple[Path, int]:
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from helpers import build_chat_model

    build_chat_model(out / "tok")  # a ChatML BPE tokenizer (the model beside it is replaced)
    tok = PreTrainedTokenizerFast.from_pretrained(out / "tok")
    config = Qwen2Config(vocab_size=len(tok), hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    return out / "model", sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA device"
    from grpo_aug.eventlog import read_scalars
    from grpo_aug.pipeline import train
    from helpers import compose_cfg

    vllm = importlib.util.find_spec("vllm") is not None and not args.no_vllm
    with tempfile.TemporaryDirectory() as tmp:
        model, params = build(Path(tmp))
        overrides = ["model=hf", f"model.name_or_path={model}", "model/lora=on", "trainer=gpu",
                     f"trainer.max_steps={args.steps}", "trainer.val_check_interval=1000",
                     "validate_before_training=false", "data/prompt_format=chat", "rollout.group_size=8",
                     "rollout.max_new_tokens=128", "data.batch_size=8", "logger=csv",
                     *(["rollout/engine=vllm"] if vllm else [])]
        start = time.perf_counter()
        train(compose_cfg(Path(tmp) / "run", overrides))
        seconds = time.perf_counter() - start
        scalars = read_scalars(Path(tmp) / "run" / "run")
        tokens = scalars["rollout/tokens_total"][-1][1] if "rollout/tokens_total" in scalars else float("nan")
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "params": params, "engine": "vllm" if vllm else "hf",
                      "steps": args.steps, "seconds_per_step": seconds / args.steps,
                      "generated_tokens_per_s": tokens / seconds,
                      "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30}, indent=2))


if __name__ == "__main__":
    main()
