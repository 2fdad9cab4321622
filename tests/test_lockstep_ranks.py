"""Two gloo ranks whose data differ: every rank reaches the same collectives, and the update is
the global batch's, whatever the split.

One global batch (4 prompts x G = 4 rows, sampled once here by the real rollout, binary rewards
set by hand) is updated on two ranks, rank r taking groups 2r and 2r+1, through the real
PolicyUpdate (zero-std filter, reference forward, length chunks, micro-batches, minibatches)
under FSDP2 or DDP (gloo CPU ranks; NCCL on two GPUs under scripts/gpu_check.py), and in one
process over all four groups. With plain SGD the weights after
the update are w - lr * g: the two ranks' weights must equal the one process's, so the gradient
is the global batch's, not a mean of per-rank means. A hang (a rank skipping a collective) fails
the test at the join timeout.
"""

from __future__ import annotations

import contextlib
import os
import types

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpo_aug.algo.aggregate import TokenMean
from grpo_aug.algo.settings import AlgoSettings
from helpers import DEVICE, ON_GPU, free_port

G = 4
LR = 0.5
# rank 0's groups (0, 1) vary; rank 1's (2, 3) as each case says
VARIED = [[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]]
FLAT = [[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]
ONE_VARIED = [[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
CASES = {
    # rank 1 has no group after the zero-std filter: under FSDP2 its reference forward and its
    # update's forwards and backwards must still pair with rank 0's
    "fsdp2-rank1-flat": ("fsdp", FLAT, {}),
    # DDP: every backward is an all-reduce; micro-batches of 3 rows, 8 rows on rank 0, none on rank 1
    "ddp-rank1-flat-micro": ("ddp", FLAT, {"micro_batch_rows": 3}),
    # unequal rows (8 and 4), micro-batches, two minibatches (rank 1's second is empty), token mean
    "fsdp2-unequal-micro-minibatches": ("fsdp", ONE_VARIED, {"micro_batch_rows": 3, "minibatches": 2,
                                                             "loss": TokenMean()}),
}
# The one process's group order: a minibatch is every rank's j-th slice of its own groups, so with
# two minibatches the global ones are {0, 2} then {1} (group 3 is flat), which one process over
# groups [0, 2, 1, 3] splits the same way.
ORDER = {"fsdp2-unequal-micro-minibatches": [0, 2, 1, 3]}


def _algo(over: dict) -> AlgoSettings:
    return AlgoSettings(max_grad_norm=None, **over)  # no clip: it would hide a gradient of the wrong scale


class DistRanks:
    """distributed.Ranks' reductions straight over torch.distributed (Lightning's strategy.reduce)."""

    world = 2

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def _all(self, values: torch.Tensor, op) -> torch.Tensor:
        out = torch.as_tensor(values).detach().clone().float().to(self.device)
        dist.all_reduce(out, op=op)
        return out

    def sum(self, values):
        return self._all(values, dist.ReduceOp.SUM)

    def max(self, values):
        return self._all(values, dist.ReduceOp.MAX)

    def mean(self, value: float) -> float:
        return float(self._all(torch.tensor(value), dist.ReduceOp.SUM)) / self.world

    def reduce(self, values, op: str):
        return self.sum(values) / self.world if op == "mean" else self._all(values, getattr(dist.ReduceOp, op.upper()))


def _groups(sampled, idx: list[int]):
    """The groups `idx` of a SampledGroups, rows and all (what one rank would have rolled out)."""
    from grpo_aug.engines.rows import select_rows

    sel = torch.tensor(idx)
    rows = (sel[:, None] * G + torch.arange(G)).reshape(-1)
    return sampled._replace(prompts=[sampled.prompts[i] for i in idx], rollout=select_rows(sampled.rollout, rows),
                            rewards=sampled.rewards[sel], parts={k: v[sel] for k, v in sampled.parts.items()},
                            distinct=sampled.distinct[sel], scored=sampled.scored[sel], valid=sampled.valid[sel],
                            informative=sampled.informative[sel], kept=sampled.kept[sel],
                            std_gain=sampled.std_gain[sel])


def _to(sampled, device):
    """A SampledGroups with every tensor (its rollout's too) on `device`."""
    def moved(t):
        return t._replace(**{k: v.to(device) for k, v in t._asdict().items() if torch.is_tensor(v)})

    return moved(sampled)._replace(rollout=moved(sampled.rollout),
                                   parts={k: v.to(device) for k, v in sampled.parts.items()})


def _update(policy, reference, sampled, ranks, over: dict, backward) -> float:
    """The real stage 3 on `sampled` with SGD; returns the reported loss of the first update."""
    from grpo_aug.models.loading import load_tokenizer
    from grpo_aug.update.policy_update import OptimizerHandle, PolicyUpdate

    update = PolicyUpdate(_algo(over))
    update.bind(load_tokenizer(os.environ["LOCKSTEP_MODEL"]), ranks)
    # built before any forward, as Lightning does: FSDP2 leaves the root's weights unsharded after a
    # no-grad forward, and parameters() would then hand the optimizer those temporary tensors
    optimizer = torch.optim.SGD(policy.parameters(), lr=LR)
    step = update.prepare(policy, sampled, lambda: contextlib.nullcontext(reference))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    updates, _, _ = update.train(policy, step, OptimizerHandle(optimizer, schedule, backward, 0))
    return float(updates.loss[0])


def _worker(rank, port, model_dir, data, case, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCKSTEP_MODEL=model_dir)
    device = torch.device(f"cuda:{rank}" if ON_GPU else "cpu")
    if ON_GPU:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if ON_GPU else "gloo", rank=rank, world_size=2)
    from grpo_aug.models.loading import load_policy
    from grpo_aug.models.sharding import full_state_dict, shard_fsdp2

    strategy, _, over = CASES[case]
    policy = load_policy(model_dir).to(device)
    reference = load_policy(model_dir).to(device).eval().requires_grad_(False)
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(DEVICE, (2,))
        shard_fsdp2(policy, mesh), shard_fsdp2(reference, mesh)

        def backward(loss):
            loss.backward()
    else:
        from lightning.pytorch.overrides.distributed import prepare_for_backward
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(policy, device_ids=[rank] if ON_GPU else None)

        def backward(loss):  # what Lightning's DDP strategy does around manual_backward
            prepare_for_backward(wrapped, loss)
            loss.backward()
    sampled = _to(_groups(torch.load(data, weights_only=False), [2 * rank, 2 * rank + 1]), device)
    loss = _update(policy, reference, sampled, DistRanks(device), over, backward)
    weights = full_state_dict(policy) if strategy == "fsdp" else {k: v.detach().cpu() for k, v in
                                                                    policy.state_dict().items()}
    if rank == 0:
        torch.save((loss, weights), out)
    dist.barrier()
    dist.destroy_process_group()


def _global_batch(model_dir, rank1_rewards, path):
    """The real rollout of 4 easy prompts, G rows each, with the rewards set by hand (binary)."""
    from grpo_aug.data.synthetic import SyntheticArithmetic
    from grpo_aug.rollout.filter import informative_groups
    from grpo_aug.rollout.settings import RolloutSettings
    from helpers import make_module

    module = make_module(model_dir, rollout=RolloutSettings(group_size=G, max_new_tokens=12))
    module.configure_model()
    prompts = [r for r in SyntheticArithmetic(size_per_bucket=8, seed=0).load() if r.bucket == "easy"][:4]
    torch.manual_seed(0)
    sampled = module.rollout.sample_round(module.policy, prompts, torch.Generator().manual_seed(0))
    rewards = torch.tensor(VARIED + rank1_rewards)  # [4, G]
    ones = torch.ones(4, G, dtype=torch.bool)
    informative = informative_groups(rewards, ones)  # the zero-std filter (on by default) keeps these
    sampled = sampled._replace(rewards=rewards, distinct=ones, scored=ones, valid=ones, informative=informative,
                               kept=informative)
    torch.save(sampled, path)
    return sampled


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_with_different_data_reach_the_same_collectives_and_update_as_one_process(
        case, tiny_model_dir, tmp_path, monkeypatch):
    from grpo_aug.distributed import Ranks
    from grpo_aug.models.loading import load_policy

    _, rank1, over = CASES[case]
    data, out = str(tmp_path / "batch.pt"), str(tmp_path / "ranks.pt")
    sampled = _global_batch(str(tiny_model_dir), rank1, data)
    assert sampled.informative.tolist() == [True, True] + [r[0] != r[1] or len(set(r)) > 1 for r in rank1]

    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, str(tiny_model_dir), data, case, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    hung = [p.pid for p in procs if p.exitcode is None]
    for p in procs:
        if p.exitcode is None:
            p.kill()
    assert not hung, f"ranks {hung} still running after 180 s: a collective one rank skipped"
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    ranks_loss, ranks_weights = torch.load(out)

    monkeypatch.setenv("LOCKSTEP_MODEL", str(tiny_model_dir))
    policy = load_policy(str(tiny_model_dir)).to(DEVICE)
    reference = load_policy(str(tiny_model_dir)).to(DEVICE).eval().requires_grad_(False)
    before = {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()}
    whole = _to(_groups(torch.load(data, weights_only=False), ORDER.get(case, [0, 1, 2, 3])), DEVICE)
    loss = _update(policy, reference, whole,
                   Ranks(types.SimpleNamespace(_trainer=None)), over, lambda x: x.backward())
    mine = {k: v.detach().cpu() for k, v in policy.state_dict().items()}
    moved = max(float((mine[k] - before[k]).abs().max()) for k in mine)
    assert moved > 1e-3  # the update moved the weights: equal weights are not equal because nothing moved
    assert ranks_loss == pytest.approx(loss, rel=1e-5, abs=1e-7)
    assert ranks_weights.keys() == mine.keys()
    for k in mine:
        gap = (ranks_weights[k] - mine[k]).abs().max()
        assert torch.allclose(ranks_weights[k], mine[k], rtol=0, atol=1e-5), (k, gap)
