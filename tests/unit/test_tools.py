"""Tools and multi-turn rollouts: masks, budgets, log-probs, hostile tools, protocols, config."""

import time

import pytest
import torch
from tool_fixtures import Scripted, huge, raising, sleeping

from grpo_aug.data.records import Prompt
from grpo_aug.engines.hf import HFEngine
from grpo_aug.engines.sampling_options import SamplingOptions
from grpo_aug.engines.turns import MultiTurnEngine
from grpo_aug.models.loading import load_policy, load_tokenizer
from grpo_aug.tools.calculator import calculator
from grpo_aug.tools.protocol import TextTools
from grpo_aug.tools.runner import ToolLimits, ToolRunner
from grpo_aug.warmup.supervised import Demonstration, sft_batch, tool_demonstration

PROMPT = "Q: 2+3+4?\nA: "
EOS = "</s>"


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


def _run(tok, script, texts, max_new_tokens=40, cap=64, options=None, calls=4):
    tools = TextTools(max_transcript_tokens=cap, limits=ToolLimits(max_calls_per_row=calls))
    engine = Scripted(script)
    ro = MultiTurnEngine(engine, tools).generate(torch.nn.Linear(1, 1), tok, texts, torch.ones(len(texts)), 1.0,
                                                 max_new_tokens, options=options)
    return ro, engine


def test_two_tool_calls_masks_logprobs_and_budgets_by_hand(tok):
    script = {PROMPT: ("[2+3]", False),
              PROMPT + "[2+3]=5": ("\n[5+4]", False),
              PROMPT + "[2+3]=5\n[5+4]=9": ("\n#### 9", True)}
    ro, engine = _run(tok, script, [PROMPT])
    # [2+3] =5 \n[5+4] =9 \n#### 9 EOS: positions 0-4 policy, 5-6 tool, 7-12 policy, 13-14 tool, 15-22 policy
    given = [False] * 5 + [True] * 2 + [False] * 6 + [True] * 2 + [False] * 8
    assert ro.given[0].tolist() == given
    assert ro.completion_mask[0].tolist() == [1] * 23
    assert ro.written[0].sum() == 19
    assert tok.decode(ro.input_ids[0, ro.prompt_len :]) == "[2+3]=5\n[5+4]=9\n#### 9" + EOS
    assert ro.texts == ["[2+3]=5\n[5+4]=9\n#### 9"]
    # each policy segment's log-probs where its tokens sit; 0 on the tool's tokens
    seg = [-0.01 * (k + 1) for k in range(5)], [-0.01 * (k + 1) for k in range(6)], [-0.01 * (k + 1) for k in range(8)]
    expected = seg[0] + [0.0, 0.0] + seg[1] + [0.0, 0.0] + seg[2]
    assert ro.sample_logprobs[0].tolist() == pytest.approx(expected)
    assert ro.tool_calls.tolist() == [2] and ro.tool_failures.tolist() == [0] and not ro.truncated[0]
    assert ro.segments[0] == [("policy", "[2+3]"), ("tool", "=5"), ("policy", "\n[5+4]"), ("tool", "=9"),
                              ("policy", "\n#### 9")]
    # the policy's budget shrinks by its own tokens only (40, 40-5, 40-11); the transcript's by all (64, 57, 49)
    assert [limits for _, limits in engine.calls] == [[40], [35], [29]]


def test_policy_budget_and_transcript_cap_truncate_and_rows_without_calls_end_in_one_round(tok):
    script = {PROMPT: ("[2+3]", False), PROMPT + "[2+3]=5": ("\n[5+4]", False),
              PROMPT + "[2+3]=5\n[5+4]=9": ("\n#### 9", True), "Q: 1?\nA: ": ("#### 1", True)}
    # policy budget 12: [2+3] (5) + \n[5+4] (6) leaves 1 token for the last segment
    ro, _ = _run(tok, script, [PROMPT, "Q: 1?\nA: "], max_new_tokens=12)
    assert ro.truncated.tolist() == [True, False]
    assert ro.written[0].sum() == 12 and ro.given[0].sum() == 4
    assert ro.texts[1] == "#### 1" and ro.tool_calls.tolist() == [2, 0]
    # a transcript cap of 8 tokens: the first call's answer is cut to fit and the row ends
    ro, engine = _run(tok, script, [PROMPT], cap=6)
    assert ro.texts == ["[2+3]="] and ro.truncated.tolist() == [True] and ro.given[0].tolist() == [False] * 5 + [True]
    assert len(engine.calls) == 1


def test_one_call_more_than_the_cap_ends_the_row_truncated(tok):
    script = {PROMPT: ("[2+3]", False), PROMPT + "[2+3]=5": ("\n[5+4]", False)}
    ro, engine = _run(tok, script, [PROMPT], calls=1)
    assert ro.texts == ["[2+3]=5\n[5+4]"] and ro.tool_calls.tolist() == [1] and ro.truncated.tolist() == [True]


def test_a_stop_string_of_rollout_stop_ends_the_row_as_without_tools(tok):
    script = {PROMPT: ("[2+3]", False), PROMPT + "[2+3]=5": (" done\nQ: next", False)}
    ro, _ = _run(tok, script, [PROMPT], options=SamplingOptions(stop=("\nQ:",)))
    assert ro.texts == ["[2+3]=5 done"] and not ro.truncated[0] and ro.tool_calls.tolist() == [1]


def test_an_end_marker_without_a_call_continues_the_row_without_tool_tokens(tok):
    script = {PROMPT: ("x]", False), PROMPT + "x]": ("#### 9", True)}
    ro, _ = _run(tok, script, [PROMPT])
    assert ro.texts == ["x]#### 9"] and ro.tool_calls.tolist() == [0] and ro.given is not None
    assert not ro.given.any() and ro.segments[0] == [("policy", "x]#### 9")]


class EveryEndCalls(TextTools):
    """Every end marker is a call (no call marker needed): a random model writes one often enough."""

    def argument(self, segment: str) -> str | None:
        return segment[-5:] if segment.endswith(self.end) else None


def test_policy_segment_logprobs_equal_an_independent_forward_over_the_whole_transcript(tiny_model_dir, tok):
    """The real hf engine (lean decode, a fresh prefill per round) on a random tiny model: markers
    it writes by chance, a tool answering 'xy'. The sampled tokens' log-probs (T = 1) equal a
    plain forward over prompt + transcript, the tool's tokens included in the context."""
    policy = load_policy(str(tiny_model_dir))
    tools = EveryEndCalls(function="tool_fixtures.echo", end="e", max_transcript_tokens=150)
    g = torch.Generator().manual_seed(3)
    n = 48
    ro = MultiTurnEngine(HFEngine(), tools).generate(policy, tok, ["Q: What is 1 + 2?\nA: "] * n, torch.ones(n),
                                                     1.0, 80, generator=g)
    rows = (ro.tool_calls >= 2).nonzero().flatten().tolist()
    assert rows, "no row called twice: pick another seed"
    with torch.no_grad():
        logits = policy(input_ids=ro.input_ids, attention_mask=ro.attention_mask,
                        position_ids=(ro.attention_mask.cumsum(-1) - 1).clamp(min=0)).logits  # [N, P+T, V]
    P = ro.prompt_len
    logp = logits[:, P - 1 : -1].log_softmax(-1).gather(-1, ro.input_ids[:, P:, None])[..., 0]  # [N, T]
    written = ro.written.bool()
    for r in rows:
        assert torch.allclose(ro.sample_logprobs[r][written[r]], logp[r][written[r]], atol=1e-4)
        assert (ro.sample_logprobs[r][ro.given[r]] == 0).all()
        assert tok.decode(ro.input_ids[r, P:][ro.given[r]]).count("xy") == int(ro.tool_calls[r])


def test_runner_bounds_raising_hanging_huge_and_piled_up_calls():
    runner = ToolRunner(ToolLimits(time_limit_s=0.3, max_output_chars=50, max_hung=1))
    began = time.monotonic()
    out = runner.run([lambda: raising("x"), lambda: sleeping("x"), lambda: huge("x"), lambda: "fine"])
    assert time.monotonic() - began < 2.0  # the hanging call is abandoned at its deadline
    assert out[0].failed and out[0].text == "error: RuntimeError: cannot handle 'x'"
    assert out[1].failed and out[1].timed_out and "timed out after 0.3 s" in out[1].text
    assert not out[2].failed and len(out[2].text) == 50 and out[2].text.endswith("...[cut]")
    assert out[3] == ("fine", False, False)
    # one abandoned call still hangs: with max_hung=1 the next round's calls are refused at once
    began = time.monotonic()
    out = runner.run([lambda: "late", lambda: "later"])
    assert time.monotonic() - began < 0.2
    assert all(o.failed and "1 earlier calls still hang; call refused" in o.text for o in out)


def test_calculator_is_bounded_arithmetic_and_refuses_the_rest():
    assert calculator("47+8") == "55" and calculator("(12-3)*4") == "36" and calculator("7/2") == "3.5"
    for bad in ("__import__('os')", "9**9**9", "1e999999999", "x" * 500):
        with pytest.raises(ValueError):
            calculator(bad)


def test_text_protocol_finds_the_call_that_ends_the_segment():
    t = TextTools()
    assert t.argument("<<1+2=3>>3\n[47+8]") == "47+8"
    assert t.argument("x]") is None and t.argument("[4*(2+1)]") == "4*(2+1)"
    g = TextTools(call="<<", end="=", result="{output}>>")
    assert g.argument("<<47+8=") == "47+8" and g.argument("so x =") is None
    assert g.render("55") == "55>>"


def test_tool_demonstrations_show_the_answer_and_learn_the_call(tok):
    record = Prompt(id="m1", bucket="medium", question="2+3+4?", prompt=PROMPT,
                    solution="<<2+3=5>>5\n<<5+4=9>>9\n#### 9", answer="9")
    demo = tool_demonstration(record, "[", "]", "={output}")
    assert demo.pieces == (("[2+3]", True), ("=5", False), ("\n[5+4]", True), ("=9", False), ("\n#### 9", True))
    ids, _, labels = sft_batch(tok, [demo, record])
    P = len(PROMPT)
    learned = labels[0, P : P + 24] != -100
    assert learned.tolist() == [True] * 5 + [False] * 2 + [True] * 6 + [False] * 2 + [True] * 7 + [True] + [False] * 1
    # a plain record is one learned piece, as before
    assert Demonstration.of(record).key() == record.prompt + record.solution


def test_tool_rounds_are_voted_across_ranks_and_a_rank_without_open_rows_stands_in(tok):
    """Under sharded weights: this rank's row ends in round 1; the vote before each round (the
    decode loop's stop vote, asked whether every rank is done) says another rank still has a tool
    round to go after it, so this rank rolls out a one-token stand-in, which is discarded."""
    script = {PROMPT: ("#### 9", True), "Q: 2+3+4?\nA: ": ("#### 9", True)}
    votes = []

    def all_done(done_here: bool) -> bool:
        votes.append(done_here)
        return len(votes) > 2  # the other rank is done after two more rounds

    tools = TextTools(max_transcript_tokens=64)
    engine = Scripted(script)
    ro = MultiTurnEngine(engine, tools).generate(torch.nn.Linear(1, 1), tok, [PROMPT], torch.ones(1), 1.0, 40,
                                                 all_done=all_done)
    assert votes == [False, True, True]  # before the first round this rank still had its row
    assert [limits for _, limits in engine.calls] == [[40], [1]]  # the round, then a stand-in
    assert ro.texts == ["#### 9"] and ro.tool_calls.tolist() == [0]
