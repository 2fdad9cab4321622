"""Train a language model with GRPO.

    python train.py                                   # default: tiny offline model, synthetic task
    python train.py data=gsm8k rollout.group_size=16 trainer.max_steps=1000
"""

import hydra
from omegaconf import DictConfig

from grpo_aug.pipeline import train


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    train(cfg)


if __name__ == "__main__":
    main()
