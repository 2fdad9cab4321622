"""TRL's GRPOTrainer trained from a grpo-aug start, judged by grpo-aug's held-out evaluation.

The start zoo's `trl` arm (benchmarks/start_zoo.py): the same composed config as a train.py arm
gives the task sample, the held-out split, the start (the warm-up, built or read from the cache
exactly as train.py does) and the reward; TRL 1.16 then trains on it the way a TRL user would:

- the whole training pool, shuffled (no curriculum), 16 prompts x 8 completions per step;
- one temperature (1.0), top_p = rollout.top_p, rollout.max_new_tokens new tokens;
- loss_type="grpo" (each row's token mean, then the mean over rows: grpo-aug's algo/loss=row_mean),
  group-std advantages, clip 0.2, beta = algo.beta.value (k3 KL against the start), one pass;
- grpo-aug's optimizer and lr schedule (model.optimizer, lr_warmup_steps, lr_final_ratio), handed
  to TRL as its `optimizers`, and max_grad_norm = algo.max_grad_norm;
- grpo-aug's reward (`reward` group) on each completion's text;
- float32 throughout, as model.dtype: TRL 1.16 turns bf16 autocast on by default, on CPU too,
  and gradient checkpointing off, as grpo-aug's default; --bf16: TRL's bf16=True (autocast around
  float32 weights, as its users run it on an AMX CPU), the arm experiment=smollm2_arith compares with.

`--budget S` stops training at the first step that ends S seconds after the script's start (each
evaluation's `since_start_s` says when it ended): an arm judged at equal wall time with train.py runs.
Every `--eval-every` steps (and at step 0) the policy TRL trains is evaluated by grpo-aug's own
held-out evaluation (greedy, the same prompts, engine and answer format as a train.py run), so
its curve is comparable with the zoo's other arms. Writes one JSON file in sample_efficiency.py's
run format (steps, seconds, per-bucket curves and finals, wall_s) with a `why` of TRL's logs.

    python benchmarks/trl_learning.py --out trl.json -- model.warmup.seed=1 paths.cache_dir=$PWD/outputs/cache
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        # paths read Hydra's runtime, which only a hydra.main run sets: named here instead
        return hydra_compose("train", overrides=[f"paths.root_dir={ROOT}", "paths.output_dir=.", *overrides])


def heldout_accuracy(model, tokenizer, datamodule, accuracy, max_new_tokens: int, engine) -> dict[str, float]:
    """grpo-aug's evaluation of `model`: the datamodule's held-out batches, in its prompt format,
    as a train.py run's validation step evaluates them (greedy, through the run's hf engine)."""
    import torch

    was_training = model.training
    model.eval()
    with torch.no_grad():
        for batch in datamodule.val_batches():
            texts = datamodule.prompt_format([r.prompt for r in batch], [r.context for r in batch])
            accuracy.evaluate(engine, model, tokenizer, texts, batch, max_new_tokens, 0, torch.device("cpu"))
    model.train(was_training)
    return accuracy.compute()


def one_bucket_per_step(records, steps: int, prompts: int, seed: int) -> list[int]:
    """Record indices in training order: each step's `prompts` from one bucket, the bucket drawn
    uniformly (grpo-aug's sampler draws one bucket per step; TRL's whole pool mixes them)."""
    import random

    from grpo_aug.data.records import BUCKETS

    rng = random.Random(seed)
    members = {b: [i for i, r in enumerate(records) if r.bucket == b] for b in BUCKETS}
    order = []
    for _ in range(steps):
        order += rng.sample(members[rng.choice([b for b in BUCKETS if members[b]])], prompts)
    return order


def run(overrides: list[str], steps: int, eval_every: int, blocked: bool = False, bf16: bool = False,
        stream: int | None = None, budget: float | None = None, micro_batch: int | None = None) -> dict:
    from datasets import Dataset
    from hydra.utils import instantiate
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_aug.data.records import BUCKETS
    from grpo_aug.dtypes import native_bf16
    from grpo_aug.models.evaluation import HeldoutAccuracy
    from grpo_aug.models.optimization import Optimization
    from grpo_aug.pipeline import check_tools, prepare_model, prompt_datamodule, rollout_settings

    began = time.time()
    cfg = compose(overrides)
    model_settings = instantiate(cfg.model)
    rollout = rollout_settings(cfg.rollout)
    datamodule = prompt_datamodule(cfg, total_steps=steps, updates_per_batch=1)
    datamodule.setup("fit")
    start = prepare_model(model_settings, datamodule.train_records, cfg.paths.cache_dir, cfg.seed, check_tools(cfg))
    reward_set = instantiate(cfg.reward, _convert_="all")
    accuracy = HeldoutAccuracy(answer=instantiate(cfg.answer, _convert_="all"))
    engine = instantiate(cfg.rollout.engine)  # the run's hf engine: e.g. its bf16 sampling copy
    records = datamodule.train_records
    tokenizer = AutoTokenizer.from_pretrained(start)
    prompt_format = datamodule.prompt_format.bind(tokenizer, start)  # a chat format needs the template
    datamodule.prompt_format = prompt_format  # the held-out evaluation formats its prompts the same way
    texts = prompt_format([r.prompt for r in records], [r.context for r in records])

    def reward(prompts, completions, idx, **kwargs) -> list[float]:
        scores = reward_set.score([records[i] for i in idx], [[c] for c in completions])
        return scores.total[:, 0].tolist()

    model = AutoModelForCausalLM.from_pretrained(start)
    optimization = Optimization(model_settings.optimizer, model_settings.lr_warmup_steps,
                                model_settings.lr_final_ratio)
    built = optimization.build(model.parameters(), steps)
    curves: dict[str, list[float]] = {b: [] for b in BUCKETS}
    at: list[int] = []
    seconds: list[float] = []
    since_start: list[float] = []
    clock = [0.0]

    def evaluate(step: int) -> None:
        if not at:
            clock[0] = time.time()
        result = heldout_accuracy(model, tokenizer, datamodule, accuracy, rollout.max_new_tokens, engine)
        at.append(step)
        seconds.append(round(time.time() - clock[0], 1))
        since_start.append(round(time.time() - began, 1))
        for b in BUCKETS:
            curves[b].append(result[f"eval/accuracy/{b}"])
        print(json.dumps({"step": step, "since_start_s": since_start[-1], **result}), flush=True)

    class Evaluate(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            evaluate(0)

        def on_step_end(self, args, state, control, **kwargs):
            # past the budget: stop without another evaluation (one made after it would not count)
            if budget is not None and time.time() - began > budget:
                control.should_training_stop = True
            elif state.global_step % eval_every == 0:
                evaluate(state.global_step)

    order = (one_bucket_per_step(records, steps, cfg.data.batch_size, cfg.seed) if blocked
             else list(range(len(records))))
    with tempfile.TemporaryDirectory() as out:
        rows = cfg.data.batch_size * rollout.group_size
        micro = micro_batch or rows
        if rows % micro:
            raise SystemExit(f"--micro-batch {micro} must divide the {rows} rows of a step")
        args = GRPOConfig(
            # one generation of `rows` completions per optimizer step, its loss in rows/micro parts
            output_dir=out, per_device_train_batch_size=micro, gradient_accumulation_steps=rows // micro,
            generation_batch_size=rows,
            num_generations=rollout.group_size, max_completion_length=rollout.max_new_tokens,
            temperature=1.0, top_p=rollout.top_p, loss_type="grpo", scale_rewards="group",
            epsilon=cfg.algo.clip_eps_low, epsilon_high=cfg.algo.clip_eps_high, beta=cfg.algo.beta.value,
            num_iterations=1, max_steps=steps, max_grad_norm=cfg.algo.max_grad_norm,
            use_cpu=True, bf16=bf16, gradient_checkpointing=False, report_to=[], logging_steps=1, save_strategy="no",
            seed=cfg.seed if stream is None else stream, data_seed=cfg.seed if stream is None else stream,
            shuffle_dataset=not blocked,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, processing_class=tokenizer,
                              train_dataset=Dataset.from_list([{"prompt": texts[i], "idx": i} for i in order]),
                              optimizers=(built["optimizer"], built["lr_scheduler"]["scheduler"]),
                              callbacks=[Evaluate()])
        trainer.train()
        logs = trainer.state.log_history

    def logged(key: str, lo: int = 0, hi: int = 10**9) -> float | None:
        values = [h[key] for h in logs if key in h and lo <= h.get("step", 0) <= hi]
        return statistics.mean(values) if values else None

    # TRL's share of groups with equal rewards: with equal group sizes, grpo-aug's flat_rows_frac
    result = {"steps": at, "seconds": seconds, "since_start_s": since_start, "tokens": [None] * len(at),
              "steps_done": trainer.state.global_step, "micro_batch": micro,
              "bf16": bf16, "bf16_hardware": native_bf16()[1],
              "flat_rows_frac": logged("frac_reward_zero_std"),
              "wall_s": round(time.time() - began, 1),
              "why": {"train_reward_first25": logged("reward", 0, 25), "train_reward_last25": logged("reward", 175),
                      "completion_length_mean": logged("completions/mean_length"),
                      "kl_last": logged("kl", steps - 25), "truncated": logged("completions/clipped_ratio")}}
    for b in BUCKETS:
        result[b] = curves[b]
        result[f"final_{b}"] = statistics.mean(curves[b][-3:])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the run's JSON")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--one-bucket-per-step", action="store_true",
                        help="each step's prompts from one bucket drawn a third each, in order (not the mixed pool)")
    parser.add_argument("--bf16", action="store_true", help="TRL's bf16=True (autocast on the CPU)")
    parser.add_argument("--stream", type=int, help="TRL's own seed (sampling and its shuffle of the pool), the data "
                        "and the start staying those of the config's seed: another run, as module.rollout.seed is")
    parser.add_argument("--budget", type=float, help="seconds from the script's start after which training stops "
                        "at the end of its step, without another evaluation (judging arms at equal wall time)")
    parser.add_argument("--micro-batch", type=int, help="rows per forward/backward (TRL's per_device_train_batch_size, "
                        "gradients accumulated over the step's rows): TRL in float32 at SmolLM2's shape needs it "
                        "in 24 GB")
    parser.add_argument("overrides", nargs="*", help="train.py overrides: the start and seed")
    args = parser.parse_args()
    args.out.write_text(json.dumps(run(args.overrides, args.steps, args.eval_every, args.one_bucket_per_step,
                                       args.bf16, args.stream, args.budget, args.micro_batch), indent=1))


if __name__ == "__main__":
    main()
