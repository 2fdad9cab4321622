"""Synchronised generation for sharded weights, simulated with two gloo processes on CPU: the
ranks' rows end at different steps, and still every rank runs the same number of forwards (a
sharded forward is a collective: a rank that stopped early would leave the other waiting)."""

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpo_aug.engines.hf import HFEngine
from grpo_aug.engines.sampling import generate

EOS, PAD, WORD = 2, 0, 5
VOCAB = 8


class Scripted(torch.nn.Module):
    """Writes WORD, then EOS at position `stop` (every row of this rank alike); counts its forwards."""

    def __init__(self, stop):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.stop, self.forwards = stop, 0

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=True,
                logits_to_keep=0):
        self.forwards += 1
        logits = torch.full((len(input_ids), 1, VOCAB), -10.0)
        logits[:, 0, WORD] = 0.0
        logits[position_ids[:, -1] + 1 >= self.stop, 0, EOS] = 10.0  # the next token's position
        return type("Out", (), {"logits": logits})


class Tok:
    eos_token_id, pad_token_id = EOS, PAD

    def __call__(self, texts, **kw):
        ids = torch.tensor([[1, 3, 4]] * len(texts))
        return type("Enc", (), {"input_ids": ids, "attention_mask": torch.ones_like(ids)})

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["x" * int((row == WORD).sum()) for row in ids]


def _all_done(done):
    """The cross-rank stop vote: True once every rank's rows are finished."""
    flag = torch.tensor(float(done))
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag)


def _worker(rank, port, sync, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    # prompts fill positions 0-2: rank 0's rows end after 2 tokens, rank 1's after 9 (of 12 allowed)
    model = Scripted([4, 11][rank])

    ro = generate(model, Tok(), ["a", "b"], torch.zeros(2), 1.0, 12, all_done=_all_done if sync else None,
                  lean=False)
    out[rank] = (model.forwards, ro.completion_mask.sum(1).tolist(), ro.completion_mask.shape[1])
    dist.destroy_process_group()


def _run(sync):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_worker, args=(port, sync, out), nprocs=2, join=True)
    return dict(out)


def test_ranks_run_the_same_number_of_decode_steps_and_keep_their_own_lengths():
    synced = _run(sync=True)
    (f0, len0, t0), (f1, len1, t1) = synced[0], synced[1]
    # prefill + 8 decode forwards on both ranks: rank 0, done after 2 tokens, keeps one (masked)
    # row in its batch until rank 1's rows end at token 9
    assert f0 == f1 == 9
    assert len0 == [2, 2] and len1 == [9, 9]  # each rank's rows still end where they ended
    assert t0 == t1 == 9
    alone = _run(sync=False)
    assert alone[0][0] == 2 and alone[1][0] == 9  # unsynchronised, rank 0 would stop 7 forwards early
    assert alone[0][1] == [2, 2]


def test_a_rank_with_nothing_to_refill_joins_the_round_another_rank_needs(tiny_model_dir, monkeypatch):
    import grpo_aug.engines.hf as engine_lib
    from grpo_aug.data.synthetic import SyntheticArithmetic
    from grpo_aug.models.loading import load_policy, load_tokenizer
    from grpo_aug.rewards import MathReward, RewardFunction, RewardSet
    from grpo_aug.rollout.filter import GroupFilter
    from grpo_aug.rollout.groups import GroupRollout
    from grpo_aug.rollout.settings import RolloutSettings

    easy = [r for r in SyntheticArithmetic(size_per_bucket=10, seed=0).load() if r.bucket == "easy"]
    asked = []
    settings = RolloutSettings(group_size=2, temperatures=(1.0,), max_new_tokens=3,
                               filter=GroupFilter(zero_std=True, refill=True, max_rounds=3))
    sampler = GroupRollout(settings, RewardSet([RewardFunction(MathReward())]),
                           prompt_pool=lambda *a: asked.append(a) or [])  # this rank's pool has nothing left
    sampler.bind(load_tokenizer(str(tiny_model_dir)), str(tiny_model_dir))
    votes = iter([True, True, False])  # other ranks still refill for two rounds
    sampler.any_rank = lambda flag: next(votes)
    # the decode loop's own votes are the test above's; here only the refill rounds vote
    monkeypatch.setattr(engine_lib, "generate", lambda *a, all_done=None, **k: generate(*a, **k))
    rounds = []
    plain_round = sampler.sample_round
    sampler.sample_round = lambda policy, prompts, *a: rounds.append(len(prompts)) or plain_round(policy, prompts, *a)
    out = sampler.sample(load_policy(str(tiny_model_dir)), easy[:2], step=0)
    assert len(asked) == 3  # asked every round, given nothing
    assert rounds == [2, 1, 1]  # its own round, then two stand-in rounds of one prompt
    assert len(out.prompts) == 2 and out.rounds == 1  # the stand-ins were discarded


def _eval_worker(rank, port, out):
    from grpo_aug.data.synthetic import SyntheticArithmetic
    from grpo_aug.models.evaluation import HeldoutAccuracy
    from grpo_aug.prompts.curriculum import StagedSchedule
    from grpo_aug.prompts.datamodule import PaddingBatch, PromptDataModule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dm = PromptDataModule(SyntheticArithmetic(size_per_bucket=12, seed=0),
                          StagedSchedule([{"until": 1.0, "weights": {"easy": 1.0}}]), total_steps=1, batch_size=2,
                          heldout_per_bucket=4, val_batch_size=4)
    dm.setup("validate")
    model, metric = Scripted([4, 11][rank]), HeldoutAccuracy()

    batches = dm.val_batches(rank, 2)
    for batch in batches:
        metric.evaluate(HFEngine(), model, Tok(), [p.prompt for p in batch], batch, 12, 0, torch.device("cpu"),
                        _all_done, counted=not isinstance(batch, PaddingBatch))
    totals = {name: float(m.compute()) for name, m in metric.sums.items() if name.startswith("total_")}
    out[rank] = (model.forwards, [len(b) for b in batches], totals)
    dist.destroy_process_group()


def test_heldout_evaluation_runs_as_many_forwards_on_every_rank_and_counts_each_prompt_once():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_eval_worker, args=(port, out), nprocs=2, join=True)
    (f0, sizes0, totals0), (f1, sizes1, totals1) = out[0], out[1]
    # 3 held-out batches of 4 (easy, medium, hard): rank 0 takes easy and hard, rank 1 medium and a
    # one-prompt padding batch; each batch runs prefill + 8 decode forwards on both ranks
    assert sizes0 == [4, 4] and sizes1 == [4, 1]
    assert f0 == f1 == 18
    # summed over ranks: 4 prompts per bucket, the padding prompt not among them
    assert totals0 == totals1 == {"total_easy": 4.0, "total_medium": 4.0, "total_hard": 4.0}
