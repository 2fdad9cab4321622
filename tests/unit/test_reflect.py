"""Reflective regeneration: which groups get hinted rows, how they are spliced under the original
prompt, and the importance-ratio correction the update applies to them."""

import functools

import pytest
import torch

from grpo_aug.data.prompt_format import PlainPrompt
from grpo_aug.data.records import Prompt
from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.engines.types import rollout_from_ids
from grpo_aug.fast_llama.logprobs import token_logprobs
from grpo_aug.rollout.filter import GroupFilter
from grpo_aug.rollout.reflect import Reflection
from grpo_aug.rollout.settings import RolloutSettings
from helpers import make_module, prepared

P0 = Prompt("a", "What is 47 + 38 - 9?", "Q: What is 47 + 38 - 9?\nA: ", "76",
            "<<47+38=85>>85\n<<85-9=76>>76\n#### 76", "easy")
P1 = Prompt("b", "What is 2 + 2?", "Q: What is 2 + 2?\nA: ", "4", "<<2+2=4>>4\n#### 4", "easy")


def test_hints_from_the_reference_or_the_wrong_answers():
    assert Reflection(hint="first_step").hint_for(P0, []) == "Hint: the first step is 47+38 = 85."
    wrong = Reflection(hint="wrong_answer").hint_for(P0, ["#### 75", "so 73", "#### 75", "no idea"])
    assert wrong == "Hint: a previous attempt answered 75, which is wrong."
    assert Reflection(hint="wrong_answer").hint_for(P0, ["no idea"]) is None


def test_all_wrong_groups_get_hinted_rows_spliced_under_the_original_prompt():
    # group 0 (P0): every row wrong; group 1 (P1): one row right -> left alone
    ro = rollout_from_ids([[1, 2]] * 3 + [[3]] * 3, [[7, 2], [8, 2], [9, 2], [4, 2], [5, 2], [6]],
                          [[-1.0, -1.0]] * 5 + [[-1.0]], torch.tensor([0.7, 1.0, 1.5] * 2),
                          ["#### 75", "#### 74", "#### 1", "#### 4", "#### 5", "#### 6"], [True] * 5 + [False], 0)
    asked = []

    def generate(texts, temps):  # the hinted prompts are longer: their ids differ from the original
        asked.append((texts, temps.tolist()))
        return rollout_from_ids([[1, 2, 11, 12]] * 2, [[5, 6, 2], [5, 2]], [[-0.1, -0.2, -0.3], [-0.4, -0.5]],
                                temps, ["#### 76", "#### 76"], [True, True], 0)

    out, hinted = Reflection(rows=2).apply(generate, PlainPrompt(), [P0, P1], ro, 3, pad_id=0)
    texts, temps = asked[0]
    assert texts == ["Q: What is 47 + 38 - 9? Hint: the first step is 47+38 = 85.\nA: "] * 2
    assert temps == pytest.approx([1.0, 1.5])  # the replaced rows' own temperature slots
    assert hinted.tolist() == [False, True, True, False, False, False]
    assert out.prompt_len == 2 and out.input_ids[1].tolist() == [1, 2, 5, 6, 2]  # original prompt, hinted tokens
    assert out.input_ids[2].tolist() == [1, 2, 5, 2, 0] and out.completion_mask[2].tolist() == [1, 1, 0]
    assert out.sample_logprobs[1].tolist() == pytest.approx([-0.1, -0.2, -0.3])  # the hinted sampler's
    assert out.texts == ["#### 75", "#### 76", "#### 76", "#### 4", "#### 5", "#### 6"]
    assert out.input_ids[0].tolist() == [1, 2, 7, 2, 0] and out.input_ids[5].tolist() == [0, 3, 6, 0, 0]


class Never:
    name = "never"

    def __call__(self, prompt, completion):
        return 0.0


def test_the_update_uses_the_hinted_sampler_log_probs_as_the_ratio_denominator(tiny_model_dir, monkeypatch):
    import grpo_aug.algo.loss as loss_lib
    from grpo_aug.update.chunk_loss import chunk_loss

    easy = [r for r in SyntheticArithmetic(size_per_bucket=10, seed=0).load() if r.bucket == "easy"][:2]
    m = make_module(tiny_model_dir, Never(), RolloutSettings(group_size=4, temperatures=(1.0,), top_p=1.0,
                                                             max_new_tokens=6, filter=GroupFilter(zero_std=False)),
                    reflect=Reflection(rows=2))
    m.configure_model()
    torch.manual_seed(0)
    step = prepared(m, easy)  # the untrained model is wrong everywhere: both groups are reflected
    assert step.hinted.tolist() == [False, False, True, True] * 2
    seen = {}
    plain = loss_lib.policy_loss
    monkeypatch.setattr(loss_lib, "policy_loss", lambda logps, ref, old, *a, **k: (
        seen.update(logps=logps.detach(), old=old), plain(logps, ref, old, *a, **k))[1])
    rows = torch.arange(8)
    aggregate = functools.partial(m.algo.loss.part, rows=8, tokens=step.mask.sum())
    chunk_loss(m.policy, m.update.scorer, m.update.objective, m.algo.engine_correction, step, rows, 0.04, aggregate)
    t = seen["old"].shape[1]
    mask = step.mask[:, :t].bool()
    hinted = step.hinted
    # unhinted rows: the policy itself (ratio 1); hinted rows: the sampler's log-prob under the hint
    assert torch.equal(seen["old"][~hinted], seen["logps"][~hinted])
    behaviour = step.rollout.sample_logprobs[:, :t]
    assert torch.equal(seen["old"][hinted], behaviour[hinted])
    # checked independently: those are the policy's log-probs of the same tokens after the hinted prompt
    texts = [r.prompt.replace(r.question, f"{r.question} {Reflection().hint_for(r, [])}", 1) for r in easy]
    for i in hinted.nonzero().squeeze(1).tolist():
        ids = m.tokenizer(texts[i // 4], add_special_tokens=False, return_tensors="pt").input_ids
        done = step.rollout.completion_mask[i].bool()
        completion = step.rollout.input_ids[i, step.rollout.prompt_len :][done]
        full = torch.cat([ids[0], completion])[None]
        with torch.no_grad():
            lp = token_logprobs(m.policy, full, torch.ones_like(full), ids.shape[1], torch.tensor([1.0]))[0]
        assert torch.allclose(lp, behaviour[i][: done.sum()], atol=1e-4)
        # and they differ from the log-probs under the original prompt: the ratio is a real weight
        assert not torch.allclose(lp[mask[i][: done.sum()]], seen["logps"][i][mask[i]], atol=1e-3)


@pytest.mark.parametrize("reflect", ["hint", "prefix"])
def test_a_run_with_reflection_logs_the_reflected_rows(tmp_path, reflect):
    from helpers import TINY, all_finite, read_scalars, train_here

    train_here(tmp_path, ["debug=fast", *TINY, f"rollout/reflect={reflect}", "rollout.filter.zero_std=false"])
    scalars = read_scalars(tmp_path / "run")
    rows = [v for _, v in scalars["rollout/reflected_rows"]]
    # debug=fast: 2 prompts a step; the untrained policy is wrong everywhere. hint: 2 rows per group;
    # prefix: the guided rows whose share of the reference is not empty (easy 0, medium 1, hard 2 of 2)
    assert rows and max(rows) > 0 and all(v <= 4 for v in rows)
    if reflect == "hint":
        assert all(v % 2 == 0 for v in rows)
    assert all_finite(scalars["train/loss"])


@pytest.mark.parametrize("kwargs, message", [(dict(rows=0), "rollout.reflect.rows must be >= 1, got 0"),
                                             (dict(hint="guess"), r"rollout.reflect.hint must be one of")])
def test_bad_reflection_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Reflection(**kwargs)
