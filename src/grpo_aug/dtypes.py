"""The dtypes a config may name for weights (model.dtype, model.reference_dtype, rollout.engine.sample_dtype),
and whether this machine computes in bfloat16 natively (the `${if_native_bf16:yes,no}` interpolation)."""

import functools
import logging

import torch

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@functools.cache
def native_bf16() -> tuple[bool, str]:
    """Whether bfloat16 matmuls run in hardware here, and what decided it. A CUDA GPU when one is
    visible, else the CPU: AMX or AVX512-BF16 multiply bf16 natively (6x float32's rate on an AMX
    core); without them (an AVX2 CPU) torch emulates bf16, and a bf16 matmul runs ~8x *slower* than
    float32 (one AMD EPYC core: 17 against 148 GFLOP/s)."""
    if torch.cuda.is_available():
        native, why = torch.cuda.is_bf16_supported(), f"CUDA device {torch.cuda.get_device_name()}"
    else:
        amx, avx512 = torch.cpu._is_amx_tile_supported(), torch.cpu._is_avx512_bf16_supported()
        native = amx or avx512
        why = ("CPU with AMX" if amx else "CPU with AVX512-BF16" if avx512
               else f"CPU without AMX or AVX512-BF16 ({torch.backends.cpu.get_cpu_capability()})")
    log.info("bfloat16 %s: %s", "native" if native else "emulated, float32 chosen where the config allows", why)
    return native, why

