"""Generation ahead of training (rollout.ahead=k, update/ahead.py): version tags, the staleness
drop, the queue's order, the checkpointed queue, and a real fit whose rows are trained k steps
after the weights that sampled them, against those weights' own log-probs."""

import copy
import functools
import io
from concurrent.futures import Future

import lightning as L
import torch

from grpo_aug.data.records import Prompt
from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.fast_llama.logprobs import token_logprobs
from grpo_aug.prompts.datamodule import FixedBatches
from grpo_aug.rollout.settings import RolloutSettings
from grpo_aug.step_types import Picked, SampledGroups
from grpo_aug.update.ahead import AheadQueue, QueuedRollout, drop_stale, pending_picked, stale_rows
from helpers import make_module

EASY = [r for r in SyntheticArithmetic(size_per_bucket=40, seed=0).load() if r.bucket == "easy"]


def groups(valid: list[list[bool]], informative: list[bool], versions=None) -> SampledGroups:
    v = torch.tensor(valid)
    n, G = v.shape
    return SampledGroups(prompts=EASY[:n], rollout=None, rewards=torch.zeros(n, G), parts={}, errors={}, timeouts={},
                         distinct=torch.ones(n, G, dtype=torch.bool), scored=torch.ones(n, G, dtype=torch.bool),
                         valid=v, informative=torch.tensor(informative), kept=torch.tensor(informative),
                         std_gain=torch.zeros(n), tokens=0,
                         versions=None if versions is None else torch.tensor(versions))


def test_rows_staler_than_the_bound_are_dropped_by_hand():
    assert stale_rows(torch.tensor([5, 4, 3, 2]), current=5, bound=1).tolist() == [False, False, True, True]
    assert stale_rows(torch.tensor([5, 4, 3, 2]), current=5, bound=2).tolist() == [False, False, False, True]
    # group 0 sampled 1 version ago (kept), group 1 two ago (dropped at bound 1), group 2 already flat
    sampled = groups([[True, True, False], [True, True, True], [True, True, True]], [True, True, False],
                     [[4, 4, 4], [3, 3, 3], [3, 3, 3]])
    kept, dropped = drop_stale(sampled, current=5, bound=1)
    assert dropped == 6
    assert kept.valid.tolist() == [[True, True, False], [False, False, False], [False, False, False]]
    assert kept.informative.tolist() == [True, False, False] and kept.kept.tolist() == [True, False, False]
    # without the zero-std filter a fresh flat group stays in the update; group 1 has no row left
    fresh_flat = groups([[True, True, False], [True, True, True], [True, True, True]], [True, True, False],
                        [[4, 4, 4], [3, 3, 3], [4, 4, 4]])
    unfiltered, _ = drop_stale(fresh_flat._replace(kept=torch.ones(3, dtype=torch.bool)), current=5, bound=1)
    assert unfiltered.kept.tolist() == [True, False, True]
    same, none = drop_stale(sampled, current=5, bound=2)
    assert none == 0 and same is sampled


def done(value) -> Future:
    future = Future()
    future.set_result(value)
    return future


def picked(prompts) -> Picked:
    return Picked(prompts, frozenset({prompts[0].id}), 1, 3, {prompts[0].id: -2.5}, 0.25)


def test_the_queue_trains_each_rollout_k_calls_later_tagged_with_its_version():
    queue = AheadQueue(depth=2)
    try:
        for call in range(3):  # versions 0, 0, 0: nothing trained while the queue fills
            queue.submit(picked(EASY[call : call + 1]), call, 0, lambda: groups([[True, True]], [True]))
            assert queue.ready == (call == 2)
        job, sampled, dropped = queue.take(current=0)
        assert job.rollout_step == 0 and sampled.versions.tolist() == [[0, 0]] and dropped == 0
        queue.submit(picked(EASY[3:4]), 3, 1, lambda: groups([[True, True]], [True]))
        _, sampled, dropped = queue.take(current=3)  # sampled at 0, now 3: 3 > 2 versions stale
        assert dropped == 2 and not sampled.valid.any() and queue.dropped == 2
        raised = []
        queue.submit(picked(EASY[4:5]), 4, 1, lambda: raised.append(1) or 1 / 0)
        try:
            queue.drain()
        except ZeroDivisionError:
            raised.append("surfaced")
        assert raised == [1, "surfaced"]  # a rollout that raises on the worker fails the step that waits
    finally:
        queue.close()


def test_queued_batches_go_into_the_checkpoint_as_plain_data_and_come_back():
    chat = Prompt(id="c1", question="q", prompt="p", answer="3", solution="#### 3", bucket="easy",
                  context=(("system", "Be brief."), ("assistant", "ok")))
    queue = AheadQueue(depth=1)
    try:
        queue.jobs.append(QueuedRollout(picked([chat, EASY[0]]), 7, 6, done(None)))
        # a budgeted pick keeps the rows it was given when it was queued (rollout/budget)
        queue.jobs.append(QueuedRollout(picked([EASY[1]])._replace(rows=[12]), 8, 7, done(None)))
        entries = queue.pending()
    finally:
        queue.close()
    buffer = io.BytesIO()
    torch.save(entries, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)  # what Lightning's loader allows
    back, step = pending_picked(loaded[0])
    assert step == 7
    assert back == picked([chat, EASY[0]]) and back.rows is None
    back, step = pending_picked(loaded[1])
    assert step == 8 and back.rows == [12]


class Watch(L.Callback):
    """After every step: the sampler holds the policy's weights (the push), and a copy of them."""

    def __init__(self):
        self.weights, self.pushed, self.outputs = [], [], []

    def on_train_start(self, trainer, module):
        self.weights.append(copy.deepcopy(module.policy.state_dict()))

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.outputs.append(outputs)
        self.weights.append(copy.deepcopy(module.policy.state_dict()))
        sampler, policy = module.source.copy.model.state_dict(), module.policy.state_dict()
        self.pushed.append(all(torch.equal(a, b) for a, b in zip(sampler.values(), policy.values(), strict=True)))


def test_a_fit_ahead_trains_rows_against_the_log_probs_of_the_weights_k_steps_old(tiny_model_dir, monkeypatch):
    k, steps = 2, 4

    def reward(prompt, completion):  # varies within a group: every step moves the policy
        return float(len(completion) % 2)

    module = make_module(tiny_model_dir, reward=reward, rollout=RolloutSettings(group_size=4, max_new_tokens=12,
                                                                               ahead=k),
                         optimizer=functools.partial(torch.optim.AdamW, lr=3e-2))
    seen = []
    prepare = module.update.prepare

    def spy(policy, sampled, *args, **kwargs):
        step = prepare(policy, sampled, *args, **kwargs)
        seen.append((int(sampled.versions.max()), step))
        return step

    monkeypatch.setattr(module.update, "prepare", spy)
    watch = Watch()
    trainer = L.Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[watch])
    trainer.fit(module, datamodule=FixedBatches([EASY[2 * i : 2 * i + 2] for i in range(steps + k)], ahead=k))
    assert trainer.global_step == steps
    assert [bool(o) for o in watch.outputs] == [True] * steps  # every call trains: the first queued k + 1
    assert all(watch.pushed)
    assert [version for version, _ in seen] == [0, 0, 0, 1]  # the call at step s sampled from version s - k
    policy = copy.deepcopy(module.policy)
    for s, (version, step) in enumerate(seen):
        ro = step.rollout
        policy.load_state_dict(watch.weights[version])  # the weights that sampled the rows, kept independently
        with torch.no_grad():
            expected = token_logprobs(policy, ro.input_ids, ro.attention_mask, ro.prompt_len, ro.temperatures)
        on = step.mask.bool()
        assert on.any()
        assert torch.allclose(step.old_logps[on], expected[on], atol=1e-5), s
        if version < s:  # the policy trained since: the ratio's denominator is not the trainer's own now
            policy.load_state_dict(watch.weights[s])
            with torch.no_grad():
                now = token_logprobs(policy, ro.input_ids, ro.attention_mask, ro.prompt_len, ro.temperatures)
            assert (now[on] - expected[on]).abs().max() > 1e-3
