"""FSDP2 (trainer=fsdp) on two gloo CPU processes: the sharded update equals one process's over
the same global batch, and whole runs train, save, resume with another number of ranks, and train
LoRA adapters, with generation and refill rounds voted across ranks under real sharding, and
micro-batches."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers import TINY, all_finite, free_port, read_scalars, run_train

STEPS, ROWS, T = 3, 8, 6
# float32 sums in another order (two shards, a reduce-scatter): ~1e-7 relative per step. Adam
# divides each gradient by its own running scale, so weights whose gradient is ~0 move by up to
# lr either way on rounding alone: weights are compared to 1e-3 x lr (measured: 1.0e-6 at most)
TOL = 1e-5
WEIGHT_TOL = 1e-5


def _batch():
    """A fixed global batch of completions with advantages: rows of random tokens after a shared prompt."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 30, (ROWS, 4 + T), generator=g)
    attn = torch.ones_like(ids)
    attn[1, -2:] = 0  # ragged completions
    attn[5, -4:] = 0
    adv = torch.randn(ROWS, generator=g)
    return ids, attn, adv


def _steps(model, ids, attn, adv, reduce_norm):
    """STEPS AdamW steps of the clipped GRPO loss (old = the policy at each step) with the project's
    own scoring, loss, gradient norm and clipping; returns [(loss, grad norm)] per step."""
    from grpo_aug.algo import policy_loss
    from grpo_aug.algo.optim import clip_gradients_, gradient_norm
    from grpo_aug.fast_llama.logprobs import token_logprobs

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    out = []
    mask = attn[:, 4:].float()  # [R, T]
    for _ in range(STEPS):
        optimizer.zero_grad()
        logps = token_logprobs(model, ids, attn, 4, torch.ones(len(ids)))  # [R, T]
        ref = logps.detach() - 0.05
        loss, _ = policy_loss(logps, ref, logps.detach(), adv, mask)
        loss.backward()
        norm_sq = float(gradient_norm(model)) ** 2
        norm = reduce_norm(norm_sq) ** 0.5
        clip_gradients_(model, 0.5, norm if reduce_norm is not _identity else None)
        optimizer.step()
        out.append((float(loss), norm))
    return out


def _identity(x):
    return x


def _worker(rank, port, path, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.device_mesh import init_device_mesh

    from grpo_aug.models.loading import load_policy
    from grpo_aug.models.sharding import full_state_dict, shard_fsdp2

    torch.manual_seed(0)
    model = shard_fsdp2(load_policy(path), init_device_mesh("cpu", (2,)))
    ids, attn, adv = _batch()
    half = slice(rank * ROWS // 2, (rank + 1) * ROWS // 2)  # each rank its half of the global batch

    def summed(x):
        t = torch.tensor(x, dtype=torch.float64)
        dist.all_reduce(t)
        return float(t)

    steps = _steps(model, ids[half], attn[half], adv[half], summed)
    losses = torch.tensor([loss for loss, _ in steps], dtype=torch.float64)
    dist.all_reduce(losses)  # the row-mean loss of the global batch is the ranks' mean
    weights = full_state_dict(model)
    if rank == 0:  # a file, not a queue: shared tensors die with the process that made them
        torch.save(([(float(lo) / 2, n) for lo, (_, n) in zip(losses, steps, strict=True)], weights), out)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_a_two_rank_fsdp2_update_equals_one_process_over_the_same_global_batch(tiny_model_dir, tmp_path):
    from grpo_aug.models.loading import load_policy

    ctx = mp.get_context("spawn")
    out = str(tmp_path / "sharded.pt")
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, str(tiny_model_dir), out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    sharded, weights = torch.load(out)

    torch.manual_seed(0)
    single = load_policy(str(tiny_model_dir))
    ids, attn, adv = _batch()
    whole = _steps(single, ids, attn, adv, _identity)
    for (loss, norm), (want_loss, want_norm) in zip(sharded, whole, strict=True):
        assert loss == pytest.approx(want_loss, rel=TOL, abs=1e-7)
        assert norm == pytest.approx(want_norm, rel=TOL)
    assert whole[0][1] > 0.5  # the clip binds: the sharded clip must scale by the whole model's norm
    mine = single.state_dict()
    assert weights.keys() == mine.keys()
    for k in mine:
        assert torch.allclose(weights[k], mine[k], rtol=0, atol=WEIGHT_TOL), (k, (weights[k] - mine[k]).abs().max())


FSDP = ["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true"]
RUN = ["debug=fast", *TINY, "reward=similarity", "rollout.filter.zero_std=true", "rollout.filter.refill=true"]


@pytest.mark.slow
def test_fsdp2_runs_save_resume_across_rank_counts_and_train_lora(tmp_path):
    cache = tmp_path / "cache"
    a = run_train(tmp_path / "a", [*RUN, *FSDP], cache=cache)
    assert a.returncode == 0, a.stderr[-3000:]
    scalars = read_scalars(tmp_path / "a" / "run")
    assert all_finite(scalars["train/loss"]) and all_finite(scalars["health/kl_mean"])
    assert "rollout/refill_rounds" in scalars  # the voted refill ran under sharded weights
    assert (tmp_path / "a" / "run" / "policy" / "model.safetensors").is_file()  # gathered whole from both ranks
    ckpt = tmp_path / "a" / "run" / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    full = {k: v.shape for k, v in state.items() if k.startswith("policy.")}
    assert full["policy.model.embed_tokens.weight"][1] == 32  # whole tensors, not shards
    # FSDP2 (2 ranks) -> 1 process, and 1 process -> FSDP2 (2 ranks)
    b = run_train(tmp_path / "b", [*RUN, f"ckpt_path={ckpt}", "trainer.max_steps=6"], cache=cache)
    assert b.returncode == 0, b.stderr[-3000:]
    assert [s for s, _ in read_scalars(tmp_path / "b" / "run")["eval/accuracy/easy"]] == [6]
    single = tmp_path / "b" / "run" / "checkpoints" / "last.ckpt"
    # with micro-batches of 3 rows: the ranks agree on their number under sharded weights
    micro = ["trainer.max_steps=8", "algo.micro_batch_rows=3"]
    c = run_train(tmp_path / "c", [*RUN, *FSDP, f"ckpt_path={single}", *micro], cache=cache)
    assert c.returncode == 0, c.stderr[-3000:]
    assert [s for s, _ in read_scalars(tmp_path / "c" / "run")["eval/accuracy/easy"]] == [8]
    lora = run_train(tmp_path / "d", [*RUN, *FSDP, "model/lora=on"], cache=cache)
    assert lora.returncode == 0, lora.stderr[-3000:]
    saved = torch.load(tmp_path / "d" / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["state_dict"] and all("lora_" in k for k in saved["state_dict"] if k.startswith("policy."))
