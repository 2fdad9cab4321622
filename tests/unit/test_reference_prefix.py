"""Guided rows (rollout/reflect=prefix): which groups and rows get a reference prefix, how it is
spliced into the completion, that its tokens carry no loss, and that the tokens after it are
scored in the context they were sampled in (checked against an independent forward)."""

import functools

import pytest
import torch

from grpo_aug.algo.masks import LossMask
from grpo_aug.data.prompt_format import PlainPrompt
from grpo_aug.data.records import Prompt
from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.engines.types import rollout_from_ids
from grpo_aug.fast_llama.logprobs import token_logprobs
from grpo_aug.rollout.filter import GroupFilter
from grpo_aug.rollout.reference_prefix import ReferencePrefix, prefix_text, reference_steps, spelled_out
from grpo_aug.rollout.settings import RolloutSettings
from helpers import make_module, prepared

HARD = Prompt("a", "What is 21 - 8 - 8 + 7?", "Q: What is 21 - 8 - 8 + 7?\nA: ", "12",
              "<<21-8=13>>13\n<<13-8=5>>5\n<<5+7=12>>12\n#### 12", "hard")
EASY = Prompt("b", "What is 2 + 2?", "Q: What is 2 + 2?\nA: ", "4", "<<2+2=4>>4\n#### 4", "easy")


class CharTokenizer:
    """One token per character: a prefix's given tokens are its length."""

    def __call__(self, texts, add_special_tokens=True):
        return {"input_ids": [[ord(c) for c in t] for t in texts]}


def guide(**kwargs) -> ReferencePrefix:
    g = ReferencePrefix(**kwargs)
    g.bind(CharTokenizer())
    return g


def test_prefixes_are_the_reference_lines_but_the_last_steps():
    assert reference_steps(HARD.solution) == ["<<21-8=13>>13", "<<13-8=5>>5", "<<5+7=12>>12"]
    assert prefix_text(HARD.solution, 1) == "<<21-8=13>>13\n<<13-8=5>>5\n"
    assert prefix_text(HARD.solution, 2) == "<<21-8=13>>13\n"
    assert prefix_text(HARD.solution, 3) is None  # nothing would be given
    assert prefix_text(EASY.solution, 1) is None  # one step: the row would write all of it



@pytest.mark.parametrize("line, text", [
    ("<<21-8=13>>13", "21 - 8 = 13"),  # the synthetic source: the annotation is the whole working
    ("<<(3+4)*2=14>>14", "(3 + 4) * 2 = 14"),
    ("<<-3+5=2>>2", "-3 + 5 = 2"),  # a leading minus is a sign, not an operator
    ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.", "Natalia sold 48/2 = 24 clips in May."),  # GSM8K
    ("She has 5 + 3 =<<5+3=8>>8 and then <<8*2=16>>16 pens", "She has 5 + 3 =8 and then 8 * 2 = 16 pens"),
    ("No calculation here.", "No calculation here."),
])
def test_calculator_annotations_spelled_out(line, text):
    assert spelled_out(line) == text


def test_spelled_out_prefixes():
    assert prefix_text(HARD.solution, 1, spell_out=True) == "21 - 8 = 13\n13 - 8 = 5\n"
    assert prefix_text(HARD.solution, 2, spell_out=True) == "21 - 8 = 13\n"
    assert prefix_text(HARD.solution, 3, spell_out=True) is None


def test_all_wrong_groups_get_guided_rows_with_the_prefix_in_the_completion():
    # group 0 (HARD): every row wrong -> rows 3 and 2 guided (2 and 1 reference lines), row 1 would
    # write all 3 steps (nothing given: left alone); group 1 (EASY): one step only, nothing to give
    ro = rollout_from_ids([[1, 2]] * 4 + [[3]] * 4, [[7, 9]] * 4 + [[4, 9]] * 4, [[-1.0, -1.0]] * 8,
                          torch.tensor([0.7, 1.0, 1.2, 1.5] * 2), ["#### 11"] * 4 + ["#### 5"] * 4, [True] * 8, 0)
    asked = []

    def generate(texts, temps, given):  # ids of the context: the row's prompt then the prefix (5 and 6 tokens here)
        asked.append((texts, temps.tolist(), given.tolist()))
        return rollout_from_ids([[1, 2, 20, 21, 22], [1, 2, 20]], [[30, 31, 9], [32, 9]],
                                [[-0.1, -0.2, -0.3], [-0.4, -0.5]], temps, ["<<5+7=12>>12\n#### 12", "x"],
                                [True, True], 0)

    out, guided = guide(steps_left=[1, 2, 3]).apply(generate, PlainPrompt(), [HARD, EASY], ro, 4, pad_id=0)
    texts, temps, given = asked[0]
    assert texts == [HARD.prompt + "<<21-8=13>>13\n<<13-8=5>>5\n", HARD.prompt + "<<21-8=13>>13\n"]
    assert temps == pytest.approx([1.5, 1.2])  # the replaced rows' own temperature slots
    assert out.temperatures[2:4].tolist() == pytest.approx([1.2, 1.5])
    # each context's characters past the row's 2 prompt tokens: the prefix's (26 and 14) and the prompt's text
    assert given == [len(HARD.prompt) + 26 - 2, len(HARD.prompt) + 14 - 2]
    assert guided.tolist() == [False, False, True, True] + [False] * 4
    # the original prompt, then the given tokens, then the sampled ones; the prefix is `given`
    assert out.input_ids[3, out.prompt_len :].tolist() == [20, 21, 22, 30, 31, 9]
    assert out.given[3].tolist() == [True, True, True, False, False, False]
    assert out.input_ids[2, out.prompt_len :].tolist() == [20, 32, 9, 0, 0, 0]
    assert out.given[2].tolist() == [True, False, False, False, False, False]
    assert out.completion_mask[2].tolist() == [1, 1, 1, 0, 0, 0]
    assert out.given[:2].any().item() is False and out.given[4:].any().item() is False
    assert out.sample_logprobs[3].tolist() == pytest.approx([0.0, 0.0, 0.0, -0.1, -0.2, -0.3])
    assert out.texts[3] == "<<21-8=13>>13\n<<13-8=5>>5\n<<5+7=12>>12\n#### 12"  # the rewards read all of it
    assert out.texts[2] == "<<21-8=13>>13\nx" and out.texts[:2] == ["#### 11"] * 2


def test_a_group_with_a_right_row_and_a_misaligned_context_stay_unguided():
    ro = rollout_from_ids([[1, 2]] * 2, [[7, 9], [8, 9]], [[-1.0, -1.0]] * 2, torch.tensor([1.0, 1.0]),
                          ["#### 12", "#### 3"], [True, True], 0)
    called = []
    out, guided = guide(steps_left=[1]).apply(lambda t, s, g: called.append(t), PlainPrompt(), [HARD], ro, 2, 0)
    assert not called and not guided.any() and out is ro
    wrong = ro._replace(texts=["#### 3", "#### 4"])
    g = guide(steps_left=[1])

    def merged(texts, temps, given):  # the tokenizer merged the prompt's last token with the prefix
        return rollout_from_ids([[1, 5, 20]], [[30, 9]], [[-0.1, -0.2]], temps, ["y"], [True], 0)

    out, guided = g.apply(merged, PlainPrompt(), [HARD], wrong, 2, 0)
    assert not guided.any() and out is wrong and g.unaligned == 1


def test_guided_rows_sample_at_the_guide_temperature_when_one_is_set():
    ro = rollout_from_ids([[1, 2]] * 4, [[7, 9]] * 4, [[-1.0, -1.0]] * 4, torch.tensor([0.7, 1.0, 1.2, 1.5]),
                          ["#### 11"] * 4, [True] * 4, 0)
    asked = []

    def generate(texts, temps, given):
        asked.append(temps.tolist())
        return rollout_from_ids([[1, 2, 20], [1, 2, 20]], [[30, 9], [31, 9]], [[-0.1, -0.2]] * 2, temps,
                                ["x", "y"], [True, True], 0)

    out, guided = guide(steps_left=[1, 2], temperature=0.5).apply(generate, PlainPrompt(), [HARD], ro, 4, 0)
    assert asked == [pytest.approx([0.5, 0.5])]
    # the update scores each row at the temperature it was sampled at
    assert out.temperatures.tolist() == pytest.approx([0.7, 1.0, 0.5, 0.5])
    assert guided.tolist() == [False] * 2 + [True] * 2


def test_a_guided_completion_is_no_longer_than_max_new_tokens_prefix_included(tiny_model_dir):
    m, hard, step = guided_step(tiny_model_dir, max_new_tokens=40)
    ro = step.rollout  # the untrained model is wrong everywhere: rows 2, 3 of each group guided
    for i in (2, 3, 6, 7):
        prefix = prefix_text(hard[i // 4].solution, 1 + (3 - i % 4))
        n_given = len(m.tokenizer(prefix, add_special_tokens=False).input_ids)
        assert 1 <= n_given < 40 and int(ro.given[i].sum()) == n_given
        written = int(ro.completion_mask[i].sum())
        # the untrained model seldom ends a row: one that ran out stops at 40 tokens, its prefix's among them
        assert written == 40 if ro.truncated[i] else written < 40


def test_the_loss_mask_leaves_the_given_tokens_out():
    completion = torch.tensor([[5, 6, 7, 0], [5, 6, 7, 8]])
    cmask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    given = torch.tensor([[True, True, False, False], [False, False, False, False]])
    mask = LossMask()(completion, cmask, torch.tensor([False, False]), torch.tensor([True, True]), given=given)
    assert mask.tolist() == [[0, 0, 1, 0], [1, 1, 1, 1]]


class Never:
    name = "never"

    def __call__(self, prompt, completion):
        return 0.0


def guided_step(tiny_model_dir, max_new_tokens: int):
    """The tiny model's prepared step on two hard prompts with guided rows (rows 2, 3 of each group of 4)."""
    # two-digit answers: random text does not state them by chance
    hard = [r for r in SyntheticArithmetic(size_per_bucket=10, seed=0).load() if r.bucket == "hard"
            and len(r.answer) == 2][:2]
    m = make_module(tiny_model_dir, Never(), RolloutSettings(group_size=4, temperatures=(1.0,), top_p=1.0,
                                                             max_new_tokens=max_new_tokens,
                                                             filter=GroupFilter(zero_std=False)),
                    reflect=ReferencePrefix())
    m.configure_model()
    torch.manual_seed(0)
    return m, hard, prepared(m, hard)


def test_guided_tokens_are_scored_after_the_prefix_with_ratio_one(tiny_model_dir, monkeypatch):
    import grpo_aug.algo.loss as loss_lib
    from grpo_aug.update.chunk_loss import chunk_loss

    m, hard, step = guided_step(tiny_model_dir, max_new_tokens=6)  # untrained: wrong everywhere, both groups guided
    assert step.sampled.reflected.reshape(-1).tolist() == [False, False, True, True] * 2
    assert step.hinted is None  # not an off-policy row
    ro = step.rollout
    seen = {}
    plain = loss_lib.policy_loss
    monkeypatch.setattr(loss_lib, "policy_loss", lambda logps, ref, old, *a, **k: (
        seen.update(logps=logps.detach(), old=old), plain(logps, ref, old, *a, **k))[1])
    aggregate = functools.partial(m.algo.loss.part, rows=8, tokens=step.mask.sum())
    chunk_loss(m.policy, m.update.scorer, m.update.objective, m.algo.engine_correction, step, torch.arange(8), 0.04,
               aggregate)
    assert torch.equal(seen["old"], seen["logps"])  # on-policy in its own context: ratio 1
    for i in (2, 3, 6, 7):
        prompt = hard[i // 4]
        prefix = prefix_text(prompt.solution, 1 + (3 - i % 4))  # the last row gets the longest prefix
        n_given = len(m.tokenizer(prefix, add_special_tokens=False).input_ids)
        done = ro.completion_mask[i].bool()
        # no loss on the given tokens, loss on every token the policy wrote
        assert step.mask[i, :n_given].sum() == 0 and bool((step.mask[i][done][n_given:] == 1).all())
        # independently: the policy's log-probs of the sampled tokens after prompt + prefix as one text
        context = m.tokenizer(prompt.prompt + prefix, add_special_tokens=False, return_tensors="pt").input_ids
        sampled = ro.input_ids[i, ro.prompt_len :][done][n_given:]
        full = torch.cat([context[0], sampled])[None]
        with torch.no_grad():
            lp = token_logprobs(m.policy, full, torch.ones_like(full), context.shape[1], torch.tensor([1.0]))[0]
        t = seen["logps"].shape[1]
        assert torch.allclose(seen["logps"][i, n_given : int(done.sum())][: t - n_given], lp[: t - n_given], atol=1e-4)
        assert torch.allclose(ro.sample_logprobs[i][done][n_given:], lp, atol=1e-4)  # what the sampler saw


def test_a_guided_row_is_not_counted_in_the_prompts_pass_rate():
    from grpo_aug.prompts.selection import PromptSelection
    from grpo_aug.step_types import Picked, SampledGroups

    ro = rollout_from_ids([[1]] * 4, [[2]] * 4, None, torch.ones(4), ["#### 3", "#### 4", "#### 12", "#### 12"],
                          [True] * 4, 0)
    z = torch.zeros(1, 4)
    sampled = SampledGroups([HARD], ro, z, {}, {}, {}, z.bool(), z.bool(), z.bool(), torch.tensor([True]),
                            torch.tensor([True]), torch.zeros(1), 4,
                            reflected=torch.tensor([[False, False, True, True]]))
    out = PromptSelection().outcomes(Picked([HARD], frozenset(), 0, 1, {}), sampled, 4)
    assert out[0].pass_rate == 0.0  # both right rows were guided
    sampled = sampled._replace(reflected=torch.tensor([[False, False, False, True]]))
    assert PromptSelection().outcomes(Picked([HARD], frozenset(), 0, 1, {}), sampled, 4)[0].pass_rate == 1 / 3


@pytest.mark.parametrize("kwargs, message", [(dict(steps_left=[]), r"steps_left must be a non-empty list"),
                                             (dict(steps_left=[1, 0]), r"steps >= 1 .* got \[1, 0\]"),
                                             (dict(temperature=0.0), r"reflect.temperature must be > 0.* got 0.0")])
def test_bad_guide_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ReferencePrefix(**kwargs)


def test_spell_out_gives_the_policy_the_written_out_lines():
    ro = rollout_from_ids([[1, 2]] * 4, [[7, 9]] * 4, [[-1.0, -1.0]] * 4, torch.tensor([0.7, 1.0, 1.2, 1.5]),
                          ["#### 11"] * 4, [True] * 4, 0)
    asked = []

    def generate(texts, temps, given):
        asked.append(texts)
        return rollout_from_ids([[1, 2, 20]], [[30, 9]], [[-0.1, -0.2]], temps, ["5 + 7 = 12"], [True], 0)

    out, guided = guide(steps_left=[1], spell_out=True).apply(generate, PlainPrompt(), [HARD], ro, 4, 0)
    assert asked == [[HARD.prompt + "21 - 8 = 13\n13 - 8 = 5\n"]]
    assert out.texts[3] == "21 - 8 = 13\n13 - 8 = 5\n5 + 7 = 12" and guided.tolist() == [False] * 3 + [True]
