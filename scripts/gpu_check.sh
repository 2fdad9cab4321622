#!/usr/bin/env bash
# Everything that needs a GPU, in one call (for a lent GPU machine; <= 8 minutes on one GPU):
# the gpu-marked tests (vLLM engine, FSDP), then a 20-step bf16 + LoRA (+ vLLM where installed)
# run of a ~0.5B-shape Qwen2-style model, printing step time, tokens/s and peak GPU memory.
#   bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device: this check needs one'"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
python -m pytest -q -m gpu tests/gpu
python scripts/gpu_run.py --steps 20
