#!/usr/bin/env bash
# Every GPU check in one call, on 1-8 GPUs, within 10 minutes: one line per check, PASS, FAIL, or
# SKIPPED with the reason (scripts/gpu_check.py says what each one checks); exit 1 if any failed.
# Install vLLM (pip install vllm) for the engine checks, and deepspeed for the ZeRO-3 one.
#   bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
python scripts/gpu_check.py --accelerator gpu "$@"
