import pytest
import torch

from grpo_aug.engines.sampling import generate, sample_next_token
from grpo_aug.fast_llama.logprobs import token_logprobs
from grpo_aug.models.loading import load_policy, load_tokenizer
from grpo_aug.rollout.settings import RolloutSettings

PROMPTS = ["Q: What is 3 + 4?\nA: ", "Q: 12?\nA: ", "Q: What is 47 + 8?\nA: "]


def _model(path):
    torch.manual_seed(0)
    return load_policy(str(path)), load_tokenizer(str(path))


def test_row_temperatures_cycle_through_the_ladder():
    s = RolloutSettings(group_size=6, temperatures=(0.7, 1.0, 1.5), top_p=0.95, max_new_tokens=4)
    assert torch.allclose(s.row_temperatures(2), torch.tensor([0.7, 1.0, 1.5, 0.7, 1.0, 1.5] * 2))


def test_sampler_matches_softmax_over_t():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(40000, 1)
    gen = torch.Generator().manual_seed(0)
    for t in (0.5, 1.5):
        tokens, _ = sample_next_token(logits, torch.full((40000,), t), top_p=1.0, generator=gen)
        freq = torch.bincount(tokens, minlength=4).float() / 40000
        expected = torch.softmax(logits[0] / t, dim=-1)
        assert torch.allclose(freq, expected, atol=0.01)


def test_top_p_keeps_the_smallest_nucleus():
    # probs 0.5, 0.3, 0.15, 0.05: top_p 0.7 keeps {0, 1} (0.5 < 0.7 <= 0.8), renormalised 5/8, 3/8
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().repeat(40000, 1)
    tokens, _ = sample_next_token(logits, torch.ones(40000), top_p=0.7, generator=torch.Generator().manual_seed(1))
    freq = torch.bincount(tokens, minlength=4).float() / 40000
    assert torch.allclose(freq, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.01)


def test_zero_temperature_rows_are_greedy():
    logits = torch.randn(5, 7)
    tokens, _ = sample_next_token(logits, torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0]), top_p=0.9)
    assert tokens[[0, 2, 4]].tolist() == logits.argmax(-1)[[0, 2, 4]].tolist()


def test_rollout_prefills_each_prompt_once_then_one_batched_call_per_token(tiny_model_dir):
    model, tok = _model(tiny_model_dir)
    calls = []
    model.register_forward_hook(lambda m, args, kwargs, out: calls.append(kwargs["input_ids"].shape), with_kwargs=True)
    rows = [p for p in PROMPTS for _ in range(4)]
    temps = torch.tensor([0.7, 1.0, 1.2, 1.5] * 3)
    ro = generate(model, tok, rows, temps, 0.95, max_new_tokens=6, lean=False)
    assert len(calls) == ro.completion_mask.shape[1] <= 6  # prefill + one call per further token
    assert calls[0][0] == 3 and all(shape == (12, 1) for shape in calls[1:])  # 3 distinct prompts, 12 rows
    assert ro.input_ids.shape[0] == 12 and len(ro.texts) == 12
    calls.clear()
    generate(model, tok, rows, temps, 0.95, max_new_tokens=6)
    assert [shape[0] for shape in calls] == [3]  # the lean path decodes without the HF forward


def _reference_logprobs(model, tok, prompt: str, completion: list[int], temperature: float) -> list[float]:
    """Unbatched, uncached, unpadded: one forward per prefix, log_softmax(logits / T)."""
    ids = tok(prompt, add_special_tokens=False).input_ids
    out = []
    for token in completion:
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        t = temperature if temperature > 0 else 1.0
        out.append(torch.log_softmax(logits / t, dim=-1)[token].item())
        ids = ids + [token]
    return out


def test_batched_logprobs_match_unbatched_reference(tiny_model_dir):
    model, tok = _model(tiny_model_dir)
    temps = torch.tensor([0.7, 1.5, 0.0])
    ro = generate(model, tok, PROMPTS, temps, 1.0, max_new_tokens=5, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logps = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.prompt_len, ro.temperatures)
    for i, prompt in enumerate(PROMPTS):
        n = int(ro.completion_mask[i].sum())
        completion = ro.input_ids[i, ro.prompt_len : ro.prompt_len + n].tolist()
        expected = _reference_logprobs(model, tok, prompt, completion, temps[i].item())
        assert torch.allclose(logps[i, :n], torch.tensor(expected), atol=1e-4)


def test_greedy_row_matches_independent_greedy_decoding(tiny_model_dir):
    model, tok = _model(tiny_model_dir)
    ro = generate(model, tok, PROMPTS, torch.zeros(3), 1.0, max_new_tokens=5)
    for i, prompt in enumerate(PROMPTS):
        ids = tok(prompt, add_special_tokens=False).input_ids
        for _ in range(int(ro.completion_mask[i].sum())):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
        n = int(ro.completion_mask[i].sum())
        assert ro.input_ids[i, ro.prompt_len : ro.prompt_len + n].tolist() == ids[-n:]


def test_stops_at_eos_and_masks_after_it(tiny_model_dir):
    model, tok = _model(tiny_model_dir)
    eos = tok.eos_token_id
    with torch.no_grad():  # make EOS the only likely token: every row ends at its first step
        model.lm_head.bias = None
        model.get_output_embeddings().weight[eos] += 100.0
    ro = generate(model, tok, PROMPTS, torch.ones(3), 1.0, max_new_tokens=8)
    assert ro.completion_mask.shape[1] == 1  # the loop ended early
    assert ro.completion_mask.tolist() == [[1], [1], [1]]
    assert not ro.truncated.any()


def test_slot_to_hint_assignment_and_original_record_untouched():
    from grpo_aug.data.records import Prompt

    p = Prompt(id="p", question="What is 3 + 4?", prompt="Q: What is 3 + 4?\nA: ", answer="7",
               solution="<<3+4=7>>7\n#### 7", bucket="easy")
    s = RolloutSettings(group_size=5, temperatures=(1.0,), hints=("Use an equation.", "Count on."))
    rows = s.row_prompts([p])
    assert rows == [
        "Q: What is 3 + 4? Use an equation.\nA: ",
        "Q: What is 3 + 4? Count on.\nA: ",
        "Q: What is 3 + 4? Use an equation.\nA: ",
        "Q: What is 3 + 4? Count on.\nA: ",
        "Q: What is 3 + 4? Use an equation.\nA: ",
    ]
    assert p.prompt == "Q: What is 3 + 4?\nA: "
    assert RolloutSettings(group_size=2).row_prompts([p]) == [p.prompt, p.prompt]  # off by default


def test_near_zero_temperature_rows_decode_greedily(tiny_model_dir):
    model, tok = _model(tiny_model_dir)
    greedy = generate(model, tok, PROMPTS, torch.zeros(3), 0.95, max_new_tokens=6)
    cold = generate(model, tok, PROMPTS, torch.full((3,), 1e-4), 0.95, max_new_tokens=6,
                    generator=torch.Generator().manual_seed(5))
    assert torch.equal(greedy.input_ids, cold.input_ids)


def test_chunk_saving_by_hand():
    from grpo_aug.algo.chunks import chunk_saving, length_chunks

    lengths = torch.tensor([1, 8, 2, 8])
    assert [c.tolist() for c in length_chunks(lengths, 2)] == [[0, 2], [1, 3]]
    # whole: 4 rows x (2 + 8) = 40; chunks: 2 x (2 + 2) + 2 x (2 + 8) = 28 -> saves 12/40
    assert chunk_saving(lengths, prompt_len=2, chunks=2) == pytest.approx(0.3)
    assert chunk_saving(torch.tensor([5, 5, 5]), prompt_len=2, chunks=3) == 0.0
    assert chunk_saving(lengths, prompt_len=2, chunks=1) == 0.0


def test_sampled_tokens_come_with_their_tempered_logprobs():
    # the trainer scores a token under softmax(logits / T) before any filter; greedy rows at T = 1
    torch.manual_seed(0)
    logits = torch.randn(6, 3000) * 3
    temps = torch.tensor([0.7, 1.0, 0.0, 1.5, 0.0, 1.2])
    for top_p, top_k in ((1.0, 0), (0.9, 0), (0.9, 5)):
        tokens, logprobs = sample_next_token(logits, temps, top_p, torch.Generator().manual_seed(1), top_k=top_k)
        scored_at = torch.where(temps > 0, temps, 1.0)
        expected = [torch.log_softmax(logits[i].double() / scored_at[i].double(), -1)[tokens[i]] for i in range(6)]
        assert torch.allclose(logprobs.double(), torch.stack(expected), atol=1e-5)
        assert tokens[[2, 4]].tolist() == logits.argmax(-1)[[2, 4]].tolist()
