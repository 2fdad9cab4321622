"""Sampling options in the hf engine, by value: top-k, min-p, the repetition penalty and stop
strings, against hand-computed distributions and a plain greedy loop without a KV cache."""

import pytest
import torch

from grpo_aug.engines.sampling import generate, sample_next_token
from grpo_aug.engines.sampling_options import SamplingOptions, cut_at_stop, filter_probs, penalise_repeats
from grpo_aug.models.loading import load_policy, load_tokenizer
from grpo_aug.rollout.settings import RolloutSettings

PROMPTS = ["Q: What is 3 + 4?\nA: ", "Q: 12?\nA: ", "Q: What is 47 + 8?\nA: "]


def test_top_k_1_is_greedy_at_any_temperature():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(500, 50, generator=gen)
    temps = torch.tensor([0.7, 1.0, 1.5, 3.0, 0.0]).repeat(100)
    tokens, _ = sample_next_token(logits, temps, top_p=1.0, generator=gen, top_k=1)
    assert torch.equal(tokens, logits.argmax(-1))


def test_min_p_and_top_k_drop_exactly_the_tokens_by_hand():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    # min_p 0.2: threshold 0.2 x 0.5 = 0.1 drops only 0.05; the rest renormalised over 0.95
    assert torch.allclose(filter_probs(probs, 0, 0.2), torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    # min_p 0.4: threshold 0.2 drops 0.15 and 0.05
    assert torch.allclose(filter_probs(probs, 0, 0.4), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert torch.allclose(filter_probs(probs, 3, 0.0), torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    # drawn: the frequencies of the kept tokens, never a dropped one (T = 1)
    n = 40000
    logits = probs.log().repeat(n, 1)
    tokens, _ = sample_next_token(logits, torch.ones(n), top_p=1.0, generator=torch.Generator().manual_seed(1),
                               min_p=0.4)
    freq = torch.bincount(tokens, minlength=4).float() / n
    assert freq[2:].sum() == 0 and torch.allclose(freq, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.01)
    # after the temperature: at T = 2 the probabilities flatten to ~[0.35, 0.27, 0.19, 0.11] / ...,
    # and min_p 0.4 keeps the tokens above 0.4 x the top one
    hot = torch.softmax(probs.log() / 2.0, dim=-1)[0]
    kept = hot >= 0.4 * hot.max()
    tokens, _ = sample_next_token(logits, torch.full((n,), 2.0), top_p=1.0, generator=torch.Generator().manual_seed(2),
                               min_p=0.4)
    assert set(tokens.unique().tolist()) == set(kept.nonzero().flatten().tolist())


def test_repetition_penalty_by_hand():
    logits = torch.tensor([[2.0, -1.0, 0.5, -0.2]])
    seen = torch.tensor([[True, True, False, False]])
    assert torch.allclose(penalise_repeats(logits, seen, 2.0), torch.tensor([[1.0, -2.0, 0.5, -0.2]]))
    assert penalise_repeats(logits, seen, 1.0) is logits


def _greedy_by_hand(model, tok, prompt: str, steps: int, penalty: float) -> list[int]:
    """A plain greedy loop: the full sequence through the model every token, HF's penalty rule."""
    ids = tok(prompt, add_special_tokens=False).input_ids
    out = []
    for _ in range(steps):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids + out])).logits[0, -1]
        for t in set(ids + out):
            logits[t] = logits[t] / penalty if logits[t] > 0 else logits[t] * penalty
        out.append(int(logits.argmax()))
        if out[-1] == tok.eos_token_id:
            break
    return out


@pytest.mark.parametrize("lean", [True, False])
def test_repetition_penalty_in_the_decode_loop_matches_a_plain_loop(tiny_model_dir, lean):
    model, tok = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    ro = generate(model, tok, PROMPTS, torch.zeros(3), 1.0, 12, lean=lean,
                  options=SamplingOptions(repetition_penalty=5.0))
    plain = generate(model, tok, PROMPTS, torch.zeros(3), 1.0, 12, lean=lean)
    for i, prompt in enumerate(PROMPTS):
        got = ro.input_ids[i, ro.prompt_len :][ro.completion_mask[i].bool()].tolist()
        assert got == _greedy_by_hand(model, tok, prompt, 12, 5.0)
    # the untrained model's greedy rows repeat one token; the penalty makes them differ
    assert not torch.equal(ro.input_ids, plain.input_ids)


def test_a_stop_string_ends_the_row_and_its_mask_there(tiny_model_dir):
    model, tok = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    varied = dict(repetition_penalty=5.0)  # the untrained model's greedy rows then write varied text
    free = generate(model, tok, PROMPTS, torch.zeros(3), 1.0, 16, options=SamplingOptions(**varied))
    stop = free.texts[0][3:5]  # a string the greedy row 0 writes, first ending at its 5th character
    assert len(stop) == 2 and free.texts[0].find(stop) == 3
    for include in (False, True):
        ro = generate(model, tok, PROMPTS, torch.zeros(3), 1.0, 16,
                      options=SamplingOptions(stop=(stop,), include_stop=include, **varied))
        for i in range(3):  # every row: the free row up to where it first writes the stop string, if it does
            text, ids = free.texts[i], free.input_ids[i, free.prompt_len :][free.completion_mask[i].bool()].tolist()
            at = text.find(stop)
            cut = next((n for n in range(1, len(ids) + 1) if stop in tok.decode(ids[:n], skip_special_tokens=True)),
                       len(ids))
            assert ro.texts[i] == (text if at < 0 else text[: at + len(stop)] if include else text[:at]), i
            assert ro.completion_mask[i].sum().item() == cut, i
            assert ro.input_ids[i, ro.prompt_len : ro.prompt_len + cut].tolist() == ids[:cut], i
            assert bool(ro.truncated[i]) == (at < 0 and bool(free.truncated[i])), i


def test_sampling_options_are_checked_when_the_config_is_built():
    for bad, key in [(dict(top_k=-1), "rollout.top_k"), (dict(min_p=1.0), "rollout.min_p"),
                     (dict(repetition_penalty=0.0), "rollout.repetition_penalty"), (dict(stop=[""]), "rollout.stop")]:
        with pytest.raises(ValueError, match=key):
            RolloutSettings(**bad)
    assert RolloutSettings(stop=["\n\n"], top_k=5).options == SamplingOptions(5, 0.0, 1.0, ("\n\n",), False)
    assert cut_at_stop("a.b;c.", (";", "."), include=True) == ("a.", True)
