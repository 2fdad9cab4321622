import copy
import functools

import lightning as L
import pytest
import torch

import grpo_aug.update.policy_update as update_lib
from grpo_aug.algo.loss import policy_loss
from grpo_aug.algo.optim import lr_factor
from grpo_aug.algo.settings import AlgoSettings
from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.models.optimization import Optimization
from grpo_aug.models.run_counts import NonFiniteTraining
from grpo_aug.prompts.datamodule import FixedBatches
from grpo_aug.rollout.filter import GroupFilter
from grpo_aug.rollout.settings import RolloutSettings
from grpo_aug.update.chunk_loss import chunk_loss
from helpers import make_module, prepared

EASY = [r for r in SyntheticArithmetic(size_per_bucket=40, seed=0).load() if r.bucket == "easy"]


class Capture(L.Callback):
    def __init__(self):
        self.outputs = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.outputs.append(outputs)


def fit_batches(module, batches, callbacks=()):
    """Run a real Lightning fit over the given prompt batches; the training_step outputs."""
    capture = Capture()
    steps = len(batches) * module.algo.updates_per_rollout
    trainer = L.Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[capture, *callbacks])
    trainer.fit(module, datamodule=FixedBatches(batches))
    return capture.outputs


class Pool:
    """A scripted prompt pool that records what the refill asked for."""

    def __init__(self):
        self.calls = []

    def __call__(self, bucket, n, step, round_, used):
        self.calls.append((bucket, n, round_))
        fresh = [p for p in EASY if p.id not in used]
        return fresh[:n]


class ById:
    """Reward by prompt: 'informative' prompts alternate 0/1 over their rows, others always 0."""

    name = "by_id"

    def __init__(self, informative_ids):
        self.informative_ids = set(informative_ids)
        self.count = 0

    def __call__(self, prompt, completion):
        self.count += 1
        return float(prompt.id in self.informative_ids and self.count % 2 == 0)


def _module(path, reward=None, group_filter=None, pool=None, algo=None):
    m = make_module(path, reward, RolloutSettings(group_size=4, temperatures=(0.7, 1.5), top_p=0.95, max_new_tokens=6,
                                                  filter=group_filter or GroupFilter(zero_std=False)), algo, pool)
    m.configure_model()
    return m


def test_reference_is_frozen_and_outside_optimizer_and_checkpoint(tiny_model_dir):
    m = _module(tiny_model_dir)
    ref = m.models.frozen[0]
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    optimized = {id(p) for g in m.configure_optimizers()["optimizer"].param_groups for p in g["params"]}
    assert optimized == {id(p) for p in m.policy.parameters()}
    assert not optimized & {id(p) for p in ref.parameters()}
    assert all(k.startswith(("policy.", "val_")) for k in m.state_dict())
    # the reference starts equal to the policy but is a separate copy
    p0, r0 = next(m.policy.parameters()), next(ref.parameters())
    assert torch.equal(p0, r0) and p0.data_ptr() != r0.data_ptr()


def test_training_step_gives_finite_loss_and_grads_only_to_policy(tiny_model_dir):
    torch.manual_seed(0)
    m = _module(tiny_model_dir)
    before = [p.detach().clone() for p in m.policy.parameters()]
    ref_before = [p.detach().clone() for p in m.models.frozen[0].parameters()]
    (out,) = fit_batches(m, [EASY[:3]])
    assert torch.isfinite(out["updates"].loss).all()
    assert out["report"].rewards.shape == (3, 4) and out["report"].lengths.shape == (12,)
    assert any(not torch.equal(b, p) for b, p in zip(before, m.policy.parameters(), strict=True))
    assert all(torch.equal(b, p) for b, p in zip(ref_before, m.models.frozen[0].parameters(), strict=True))
    assert all(p.grad is None for p in m.models.frozen[0].parameters())


def test_refill_stops_at_max_rounds_and_flags_exhaustion(tiny_model_dir):
    pool = Pool()
    m = _module(tiny_model_dir, reward=ById([]), group_filter=GroupFilter(True, True, max_rounds=2), pool=pool)
    step = prepared(m, EASY[:3])
    assert [(b, n) for b, n, _ in pool.calls] == [("easy", 3), ("easy", 3)]  # every group stayed flat
    assert step.sampled.rounds == 3 and step.refill_exhausted
    assert step.sampled.rewards.shape == (9, 4)  # all sampled groups are reported
    assert not step.valid.any() and step.mask.sum().item() == 0


def test_refill_collects_informative_groups_from_fresh_prompts(tiny_model_dir):
    pool = Pool()
    batch = EASY[:3]
    fresh = [p for p in EASY if p.id not in {q.id for q in batch}]
    # one batch prompt and the first two fresh ones are informative: one refill round suffices
    reward = ById([batch[0].id, fresh[0].id, fresh[1].id])
    m = _module(tiny_model_dir, reward=reward, group_filter=GroupFilter(True, True, max_rounds=3), pool=pool)
    step = prepared(m, batch)
    assert [(n, r) for _, n, r in pool.calls] == [(2, 1)]
    assert step.sampled.rounds == 2 and not step.refill_exhausted
    assert step.valid.any(dim=1).tolist() == [True, False, False, True, True]
    assert step.mask.sum().item() > 0


def test_zero_std_filter_without_refill_trains_only_informative_groups(tiny_model_dir):
    batch = EASY[:3]
    m = _module(tiny_model_dir, reward=ById([batch[1].id]), group_filter=GroupFilter(zero_std=True))
    step = prepared(m, batch)
    assert step.valid.any(dim=1).tolist() == [False, True, False]
    assert step.sampled.rounds == 1 and not step.refill_exhausted


def test_two_iterations_per_rollout_move_the_ratio_and_clip(tiny_model_dir):
    torch.manual_seed(0)
    m = _module(tiny_model_dir, reward=ById([p.id for p in EASY[:4]]), algo=AlgoSettings(num_iterations=2))
    m.optimization = Optimization(functools.partial(torch.optim.SGD, lr=20.0))  # big steps: the second pass must clip
    (out,) = fit_batches(m, [EASY[:4]])
    ratio, clip = out["updates"].ratio_mean, out["updates"].clip_frac
    assert ratio.shape == (2,)
    assert ratio[0].item() == pytest.approx(1.0, abs=1e-6)  # first pass: still the rollout policy
    assert abs(ratio[1].item() - 1.0) > 1e-3  # second pass: old log-probs from the rollout, policy moved
    assert clip[0].item() == 0.0 and clip[1].item() > 0
    assert m.trainer.global_step == 2  # one rollout, two optimizer steps


def test_minibatches_split_groups_and_each_makes_an_optimizer_step(tiny_model_dir):
    m = _module(tiny_model_dir, reward=ById([p.id for p in EASY[:3]]), algo=AlgoSettings(minibatches=2))
    outs = fit_batches(m, [EASY[:3], EASY[3:6]])
    assert [o["updates"].loss.shape for o in outs] == [(2,), (2,)]
    assert m.trainer.global_step == 4


def test_fast_path_has_no_old_logprob_forward_and_equals_the_straightforward_loss(tiny_model_dir):
    torch.manual_seed(0)
    m = _module(tiny_model_dir, reward=ById([p.id for p in EASY[:3]]))
    step = prepared(m, EASY[:3])
    assert step.old_logps is None
    logps = m.update.scorer.logprobs(m.policy, step.rollout)
    with torch.no_grad():
        old = m.update.scorer.logprobs(m.policy, step.rollout)  # what a separate old-policy forward would give
    fast, _ = policy_loss(logps, step.ref_logps, logps.detach(), step.advantages, step.mask)
    plain, _ = policy_loss(logps, step.ref_logps, old, step.advantages, step.mask)
    assert fast.item() == pytest.approx(plain.item(), abs=1e-7)
    (g_fast,) = torch.autograd.grad(fast, logps, retain_graph=True)
    (g_plain,) = torch.autograd.grad(plain, logps)
    assert torch.allclose(g_fast, g_plain, atol=1e-7)


class NoneFor:
    """1.0 for every completion except the listed row slots, which are unscorable (None)."""

    name = "none_for"

    def __init__(self, slots):
        self.slots, self.count = set(slots), -1

    def __call__(self, prompt, completion):
        self.count += 1
        return None if self.count in self.slots else float(self.count % 2)


def test_unscorable_rows_leave_loss_and_statistics(tiny_model_dir):
    m = _module(tiny_model_dir, reward=NoneFor({1, 6}))
    step = prepared(m, EASY[:2])
    valid = step.valid
    assert valid.tolist() == [[True, False, True, True], [True, True, False, True]]
    assert (step.mask.view(2, 4, -1)[~valid] == 0).all()
    assert (step.advantages.view(2, 4)[~valid] == 0).all()
    # group 0 counts rewards 0 (row 0), 0 (row 2), 1 (row 3): mean 1/3 over the counted rows only
    adv = step.advantages.view(2, 4)[0]
    assert adv[3].item() > 0 and adv[0].item() == adv[2].item() < 0


def test_truncation_and_template_masks_remove_tokens(tiny_model_dir):
    torch.manual_seed(0)
    m = _module(tiny_model_dir, algo=AlgoSettings(mask_truncated=True))
    step = prepared(m, EASY[:2])
    truncated, cm = step.rollout.truncated, step.rollout.completion_mask
    assert truncated.any()  # 6 new tokens: the untrained model rarely ends in time
    assert (step.mask[truncated] == 0).all()
    assert torch.equal(step.mask[~truncated], cm[~truncated].float())
    assert step.mask.sum().item() == cm[~truncated].sum().item()

    m = _module(tiny_model_dir, algo=AlgoSettings(template_patterns=(r"\d",)))
    step = prepared(m, EASY[:2])
    completion_ids = step.rollout.input_ids[:, step.rollout.prompt_len :].tolist()
    digit = torch.tensor([[m.tokenizer.decode([t]).isdigit() for t in row] for row in completion_ids])  # [N, T]
    on = step.rollout.completion_mask.bool()
    assert (digit & on).any() and (~digit & on).any()
    assert torch.equal(step.mask.bool(), on & ~digit)


def test_beta_schedule_state_is_checkpointed(tiny_model_dir):
    from grpo_aug.algo.beta import RelaxBeta

    m = _module(tiny_model_dir, algo=AlgoSettings(beta=RelaxBeta(patience=2)))
    m.algo.beta.observe(0, 0.0)
    ckpt = {}
    m.on_save_checkpoint(ckpt)
    fresh = _module(tiny_model_dir, algo=AlgoSettings(beta=RelaxBeta(patience=2)))
    fresh.on_load_checkpoint(ckpt)
    assert fresh.algo.beta.calm == 1


def test_length_chunks_give_the_unchunked_loss_and_gradient(tiny_model_dir):
    import functools

    from grpo_aug.algo.chunks import length_chunks

    torch.manual_seed(0)
    m = _module(tiny_model_dir, reward=ById([p.id for p in EASY[:4]]), algo=AlgoSettings(length_chunks=3))
    m.rollout.settings = RolloutSettings(group_size=4, temperatures=(0.7, 1.5), top_p=0.95, max_new_tokens=24)
    step = prepared(m, EASY[:4])
    lengths = step.rollout.completion_mask.sum(1)
    assert lengths.min() < lengths.max()  # rows of different lengths, so trimming changes shapes
    rows = torch.arange(len(lengths))
    aggregate = functools.partial(m.algo.loss.part, rows=len(rows), tokens=step.mask.sum())

    def run(chunks):
        m.policy.zero_grad()
        total = 0.0
        for chunk in chunks:
            loss, _ = chunk_loss(m.policy, m.update.scorer, m.update.objective, m.algo.engine_correction, step,
                                 rows[chunk], 0.04, aggregate)
            loss.backward()
            total += loss.item()
        return total, [p.grad.clone() for p in m.policy.parameters()]

    whole, g_whole = run([rows])
    chunked, g_chunked = run(length_chunks(lengths, 3))
    assert chunked == pytest.approx(whole, rel=1e-5, abs=1e-7)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g_whole, g_chunked, strict=True))
    # the reference log-probs from trimmed chunks are the unchunked ones wherever a token exists
    with torch.no_grad():
        plain = m.update.scorer.logprobs(m.models.frozen[0], step.rollout)
        chunked_ref = m.update.scorer.logprobs(m.models.frozen[0], step.rollout, length_chunks(lengths, 3))
    on = step.rollout.completion_mask.bool()
    assert torch.allclose(plain[on], chunked_ref[on], atol=1e-5)


def test_packed_models_score_in_one_chunk_others_in_length_chunks(tiny_model_dir, monkeypatch):
    import grpo_aug.update.scoring as scoring_lib

    m = _module(tiny_model_dir, algo=AlgoSettings(length_chunks=4))
    lengths = torch.tensor([30, 1, 1, 1, 2, 2, 1, 1])  # one long row: chunks would save most of the block
    # packed: attention groups instead
    assert [c.tolist() for c in m.update.scorer.chunks(m.policy, lengths, 5)] == [list(range(8))]
    monkeypatch.setattr(scoring_lib, "packable", lambda model: False)
    assert len(m.update.scorer.chunks(m.policy, lengths, 5)) == 4


class Snapshot(L.Callback):
    """Weights, optimizer state and lr-schedule state after each training batch."""

    def __init__(self):
        self.states = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        optimizer = trainer.optimizers[0]
        self.states.append((copy.deepcopy(pl_module.policy.state_dict()), copy.deepcopy(optimizer.state_dict()),
                            copy.deepcopy(trainer.lr_scheduler_configs[0].scheduler.state_dict()),
                            trainer.global_step))


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("poison", ["loss", "gradient"])
def test_a_non_finite_update_changes_nothing(tiny_model_dir, poison, monkeypatch):
    m = _module(tiny_model_dir)
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        loss, stats = chunk_loss(*args, **kwargs)
        if calls["n"] == 2:  # the second step's update
            if poison == "loss":
                return loss * float("nan"), stats
            # a finite loss whose gradient overflows in one weight, this backward only
            weight = m.policy.get_output_embeddings().weight
            handle = weight.register_hook(lambda g: (handle.remove(), g * float("inf"))[1])
        return loss, stats

    monkeypatch.setattr(update_lib.chunk_loss_lib, "chunk_loss", poisoned)
    snap = Snapshot()
    outs = fit_batches(m, [EASY[:3], EASY[3:6], EASY[6:9]], callbacks=[snap])
    (w1, o1, s1, g1), (w2, o2, s2, g2), (w3, o3, _, _) = snap.states
    assert _same(w1, w2) and _same(o1, o2) and _same(s1, s2)  # bit-identical after the skipped update
    assert (g1, g2) == (1, 2)  # the skipped update still counts as a step
    assert not _same(w2, w3) and not _same(o2, o3)  # the next finite update trains as usual
    assert [float(o["report"].nonfinite) for o in outs] == [0.0, 1.0, 0.0]
    assert m.counts.skipped_total == 1 and m.counts.consecutive_skipped == 0


def test_too_many_non_finite_updates_in_a_row_stop_the_run(tiny_model_dir, monkeypatch):
    m = _module(tiny_model_dir, algo=AlgoSettings(max_consecutive_nonfinite=2))

    def poisoned(*args, **kwargs):
        loss, stats = chunk_loss(*args, **kwargs)
        return loss * float("nan"), stats

    monkeypatch.setattr(update_lib.chunk_loss_lib, "chunk_loss", poisoned)
    snap = Snapshot()
    with pytest.raises(NonFiniteTraining, match=r"2 updates in a row .*\(algo.max_consecutive_nonfinite=2\)"):
        fit_batches(m, [EASY[:3], EASY[3:6], EASY[6:9]], callbacks=[snap])
    assert len(snap.states) == 1  # stopped inside the second step
    assert all(not st for st in snap.states[0][1]["state"].values())  # the optimizer never stepped


def test_an_update_with_no_loss_token_changes_nothing(tiny_model_dir):
    """Step 2's groups are all flat and filtered out: AdamW must not coast on its momentum."""
    informative = [p.id for p in EASY[:3]]
    m = _module(tiny_model_dir, reward=ById(informative), group_filter=GroupFilter(zero_std=True))
    snap = Snapshot()
    outs = fit_batches(m, [EASY[:3], EASY[3:6]], callbacks=[snap])
    (w1, o1, s1, g1), (w2, o2, s2, g2) = snap.states
    assert float(outs[0]["report"].loss_tokens) > 0 and float(outs[1]["report"].loss_tokens) == 0
    assert _same(w1, w2) and _same(o1, o2) and _same(s1, s2) and (g1, g2) == (1, 2)
    assert m.counts.skipped_total == 0  # not a non-finite skip


def test_lr_factor_ramps_then_decays_linearly_to_the_final_share():
    # warm-up 10: step s < 10 gives (s + 1) / 11; then from 1.0 at step 10 to 0.1 at step 250
    assert lr_factor(0, 10, 250, 0.1) == pytest.approx(1 / 11)
    assert lr_factor(10, 10, 250, 0.1) == pytest.approx(1.0)
    assert lr_factor(130, 10, 250, 0.1) == pytest.approx(0.55)  # halfway: 1 - 0.9 x 0.5
    assert lr_factor(250, 10, 250, 0.1) == pytest.approx(0.1) == lr_factor(400, 10, 250, 0.1)
    assert [lr_factor(s, 10, 250, 1.0) for s in (10, 249)] == [1.0, 1.0]  # no decay
    assert lr_factor(5, 10, 0, 0.1) == pytest.approx(6 / 11)  # no trainer: no decay


def test_oversampled_step_keeps_the_max_variance_rows_and_records_the_history(tiny_model_dir):
    from grpo_aug.prompts.history import PromptHistory
    from grpo_aug.prompts.predictors import HistoryPredictor
    from grpo_aug.prompts.selection import PromptSelection

    history = PromptHistory()
    m = make_module(tiny_model_dir, ById([p.id for p in EASY[:2]]),
                    RolloutSettings(group_size=4, temperatures=(0.7, 1.5), max_new_tokens=6, oversample=3),
                    selection=PromptSelection(HistoryPredictor(), history, lambda *a, **k: [], seed=0))
    m.configure_model()
    step = prepared(m, EASY[:3])
    s = step.sampled
    assert s.rewards.shape == (3, 4) and s.rollout.input_ids.shape[0] == 12 and len(s.rollout.texts) == 12
    # ById alternates 0/1 over the 12 rows of the first two prompts: the kept 4 are two of each
    assert s.rewards[:2].sum(dim=1).tolist() == [2.0, 2.0] and s.rewards[2].sum() == 0
    assert (s.std_gain[:2] >= 0).all() and s.std_gain[2] == 0
    assert [history.get(p.id).attempts for p in EASY[:3]] == [1, 1, 1]
    assert [history.get(p.id).flat_streak for p in EASY[:3]] == [0, 0, 1]
    assert m.feed.selection.window_metrics()["rollout/flat_rows_frac"] == 12 / 36


def test_beta_zero_for_the_whole_run_holds_no_reference_and_runs_no_reference_forward(tiny_model_dir):
    from grpo_aug.algo.beta import ConstantBeta, LinearBeta
    from grpo_aug.algo.ratio import SequenceRatio

    assert AlgoSettings(beta=ConstantBeta(0.0)).needs_reference is False
    assert AlgoSettings(beta=LinearBeta(0.04, 0.0)).needs_reference is True  # beta > 0 early on
    torch.manual_seed(0)
    algo = AlgoSettings(beta=ConstantBeta(0.0), ratio=SequenceRatio(), clip_ratio_c=3.0, entropy_coef=0.01)
    m = _module(tiny_model_dir, reward=ById([p.id for p in EASY[:6]]), algo=algo)
    assert m.models.frozen == []
    assert prepared(m, EASY[:3]).ref_logps is None
    before = [p.detach().clone() for p in m.policy.parameters()]
    outs = fit_batches(m, [EASY[:3], EASY[3:6]])
    assert all(torch.isfinite(o["updates"].loss).all() for o in outs)
    assert all(float(o["report"].kl_mean) == 0.0 for o in outs)
    assert any(not torch.equal(b, p) for b, p in zip(before, m.policy.parameters(), strict=True))


def test_micro_batches_accumulate_the_full_batch_gradient(tiny_model_dir, monkeypatch):
    # two optimizer steps through Lightning, the second from weights the first moved: every row at
    # once, then micro-batches of 3 rows (16 rows per step: parts of 3, 3, 3, 3, 2, 2)
    batches = [EASY[:4], EASY[4:8]]
    runs, sizes = {}, []

    def counted(policy, scorer, objective, correct, step, rows, *args, **kwargs):
        sizes.append(len(rows))
        return chunk_loss(policy, scorer, objective, correct, step, rows, *args, **kwargs)

    monkeypatch.setattr(update_lib.chunk_loss_lib, "chunk_loss", counted)
    for rows in (None, 3):
        torch.manual_seed(0)
        m = _module(tiny_model_dir, reward=ById([p.id for p in EASY[:8]]), algo=AlgoSettings(micro_batch_rows=rows))
        outputs = fit_batches(m, batches)
        runs[rows] = ([o["updates"].loss.item() for o in outputs], copy.deepcopy(m.policy.state_dict()))
    (loss_whole, w_whole), (loss_micro, w_micro) = runs[None], runs[3]
    assert sizes == [16, 16] + [3, 3, 3, 3, 2, 2] * 2
    assert loss_micro == pytest.approx(loss_whole, rel=1e-5, abs=1e-7)
    assert all(torch.allclose(w_whole[k], w_micro[k], atol=1e-6) for k in w_whole)
    assert any(not torch.equal(w_whole[k], _module(tiny_model_dir).policy.state_dict()[k]) for k in w_whole)


def test_micro_batch_parts_are_bounded_and_agree_across_ranks():
    from grpo_aug.update.scoring import micro_batches

    chunk = [torch.arange(16)]
    assert [len(p) for p in micro_batches(chunk, 3, lambda x: x)] == [3, 3, 3, 3, 2, 2]
    assert [len(p) for p in micro_batches(chunk, 16, lambda x: x)] == [16]
    # another rank needs 8 parts for this chunk: this one runs 8 too, smaller
    assert [len(p) for p in micro_batches(chunk, 3, lambda x: torch.maximum(x, torch.tensor([8])))] == [2] * 8
    # two length chunks split on their own; an empty one stays one (empty) part
    parts = micro_batches([torch.arange(5), torch.arange(5, 7), torch.arange(0)], 2, lambda x: x)
    assert [p.tolist() for p in parts] == [[0, 1], [2, 3], [4], [5, 6], []]
    with pytest.raises(ValueError, match="micro_batch_rows must be >= 1"):
        AlgoSettings(micro_batch_rows=0)
