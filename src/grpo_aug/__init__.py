"""grpo-aug: GRPO training that keeps every group of samples informative.

    python train.py                      # tiny offline model on the synthetic arithmetic task
    python train.py data=gsm8k model=hf model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct
"""

__version__ = "0.1.0"
