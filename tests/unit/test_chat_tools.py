"""A TRL-style tool function through a chat template: the schema from its docstring, the prompt
that lists it, the call in Hermes form, the result as a `tool` message the policy did not write."""

import json

import pytest
import torch
from tool_fixtures import Scripted
from transformers import AutoTokenizer

from grpo_aug.data.prompt_format import ChatPrompt, PlainPrompt
from grpo_aug.engines.turns import MultiTurnEngine
from grpo_aug.tools.protocol import ChatTools
from helpers import build_chat_model, compose_cfg

# Qwen2.5's layout, cut down: tools listed in a system turn, a tool result as a user turn
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n"
    "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    out = build_chat_model(tmp_path_factory.mktemp("chat"))
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = TOOLS_TEMPLATE
    tok.save_pretrained(out)
    return out


def test_schema_from_type_hints_and_docstring():
    tools = ChatTools(["tool_fixtures.lookup"])
    (schema,) = tools.schemas
    f = schema["function"]
    assert f["name"] == "lookup" and f["description"] == "Get the temperature in a city."
    assert f["parameters"]["properties"]["city"] == {"type": "string", "description": 'the city\'s name, e.g. "Paris".'}
    assert f["parameters"]["required"] == ["city"]


def test_a_call_through_the_chat_template_and_the_result_as_a_tool_message(chat_dir):
    tok = AutoTokenizer.from_pretrained(chat_dir)
    prompt_format = ChatPrompt().bind(tok, str(chat_dir))
    tools = ChatTools(["tool_fixtures.lookup"]).bind(tok, prompt_format)
    (prompt,) = prompt_format(["Weather in Paris?"])
    assert prompt == ("<|im_start|>system\nTools: " + json.dumps(tools.schemas[0]) + "<|im_end|>\n"
                      "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    call = '<tool_call>{"name": "lookup", "arguments": {"city": "Paris"}}</tool_call>'
    given = ("<|im_end|>\n<|im_start|>user\n<tool_response>\n21 celsius\n</tool_response><|im_end|>\n"
             "<|im_start|>assistant\n")
    engine = Scripted({prompt: (call, False), prompt + call + given: ("It is 21.", True)})
    ro = MultiTurnEngine(engine, tools).generate(torch.nn.Linear(1, 1), tok, [prompt], torch.ones(1), 1.0, 400)
    P = ro.prompt_len
    completion = ro.input_ids[0, P:][ro.completion_mask[0].bool()]
    assert tok.decode(completion) == call + given + "It is 21.<|im_end|>"
    assert tok.decode(completion[ro.given[0][: len(completion)]]) == given
    assert tok.decode(completion[~ro.given[0][: len(completion)]]) == call + "It is 21.<|im_end|>"
    assert ro.tool_calls.tolist() == [1] and ro.tool_failures.tolist() == [0] and not ro.truncated[0]
    assert [role for role, _ in ro.segments[0]] == ["policy", "tool", "policy"]


def test_bad_calls_are_errors_in_the_transcript(chat_dir):
    tok = AutoTokenizer.from_pretrained(chat_dir)
    tools = ChatTools(["tool_fixtures.lookup"]).bind(tok, ChatPrompt().bind(tok, str(chat_dir)))
    segments = ["<tool_call>{not json</tool_call>", '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
                '<tool_call>{"name": "lookup", "arguments": {"town": "Paris"}}</tool_call>', "no call </tool_call>"]
    calls = tools.requests(segments)
    assert calls[3] is None
    out = tools.runner.run(calls[:3])
    assert all(o.failed for o in out)
    assert out[0].text.startswith("error: the call is not JSON")
    assert out[1].text == "error: no tool named 'rm'; tools: lookup"
    assert out[2].text.startswith("error: TypeError:") and "town" in out[2].text


def test_chat_tools_need_the_chat_format_and_refuse_reflection_when_the_config_is_read(tmp_path):
    from grpo_aug.pipeline import check_tools

    with pytest.raises(ValueError, match="rollout/tools=functions calls tools through the chat template"):
        check_tools(compose_cfg(tmp_path, ["rollout/tools=functions"]))
    with pytest.raises(ValueError, match="rollout/tools with rollout/reflect"):
        check_tools(compose_cfg(tmp_path, ["rollout/tools=calculator", "rollout/reflect=prefix"]))
    with pytest.raises(ValueError, match="rollout.tools.functions: cannot import 'no_such.fn'"):
        check_tools(compose_cfg(tmp_path, ["rollout/tools=functions", "data/prompt_format=chat",
                                           "rollout.tools.functions=[no_such.fn]"]))
    with pytest.raises(ValueError, match="rollout.tools.limits.time_limit_s must be > 0, got 0"):
        check_tools(compose_cfg(tmp_path, ["rollout/tools=calculator", "rollout.tools.limits.time_limit_s=0"]))
    assert check_tools(compose_cfg(tmp_path, ["rollout/tools=calculator"])).warmup_share == 0.3
    with pytest.raises(ValueError, match="data/prompt_format=chat"):
        ChatTools(["tool_fixtures.lookup"]).bind(None, PlainPrompt())
