"""The dtypes a config may name for weights (model.dtype, model.reference_dtype, rollout.engine.sample_dtype)."""

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
