"""grpo-aug: GRPO training that keeps every group of samples informative.

    python train.py                      # tiny offline model on the synthetic arithmetic task
    python train.py data=gsm8k model=hf model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct
"""

from omegaconf import OmegaConf

__version__ = "0.1.0"


def _if_native_bf16(yes, no):
    """`${if_native_bf16:bf16-mixed,32-true}`: the first value where bf16 is native here, else the second."""
    from grpo_aug.dtypes import native_bf16  # torch only when a config asks

    return yes if native_bf16()[0] else no


# configs pick bf16 where the hardware multiplies it (grpo_aug.dtypes.native_bf16), float32 elsewhere
OmegaConf.register_new_resolver("if_native_bf16", _if_native_bf16, replace=True)
