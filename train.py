"""Train a language model with GRPO.

    python train.py                                   # default: tiny offline model, synthetic task
    python train.py data=gsm8k rollout.group_size=16 trainer.max_steps=1000
    python train.py mode=preflight                    # check the samples first; exit 1 on a failed check
    python train.py mode=eval model.name_or_path=<dir or .ckpt> data=gsm8k data.eval_path=<file>
"""

import sys

import hydra
from omegaconf import DictConfig

from grpo_aug.config_renames import rewrite
from grpo_aug.errors import UsageError, usage_message
from grpo_aug.host_memory import keep_freed_memory
from grpo_aug.pipeline import evaluate, train
from grpo_aug.preflight import preflight
from grpo_aug.quiet import quiet_defaults


def train_mode(cfg: DictConfig) -> int:
    train(cfg)
    return 0  # a failure raises


def eval_mode(cfg: DictConfig) -> int:
    evaluate(cfg)
    return 0


MODES = {"train": train_mode, "preflight": preflight, "eval": eval_mode}


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    try:
        if cfg.mode not in MODES:
            raise UsageError(f"mode must be one of {sorted(MODES)}, got {cfg.mode!r}")
        quiet_defaults(cfg.verbose)
        keep_freed_memory()
        status = MODES[cfg.mode](cfg)
    except Exception as err:
        message = usage_message(err)
        if message is None:  # unexpected: Hydra prints it with its traceback
            raise
        print(f"error: {message}", file=sys.stderr, flush=True)
        sys.exit(1)
    if status:
        sys.exit(status)


if __name__ == "__main__":
    sys.argv[1:], notices = rewrite(sys.argv[1:])
    for notice in notices:
        print(notice, file=sys.stderr, flush=True)
    main()
