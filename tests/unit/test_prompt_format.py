"""Chat prompts: the tokenizer's own template around the user message, checked on the token ids
the rollout feeds the model, with a ChatML BPE tokenizer built here."""

import json

import pytest
from transformers import PreTrainedTokenizerFast

from grpo_aug.data.prompt_format import ChatPrompt, PlainPrompt
from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.rollout.filter import GroupFilter
from grpo_aug.rollout.settings import RolloutSettings
from helpers import build_chat_model, make_module, prepared

EASY = [r for r in SyntheticArithmetic(size_per_bucket=10, seed=0).load() if r.bucket == "easy"]


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    return build_chat_model(tmp_path_factory.mktemp("chat"))


def _module(path, prompt_format, hints=()):
    m = make_module(path, rollout=RolloutSettings(group_size=4, temperatures=(1.0,), top_p=1.0, max_new_tokens=4,
                                                  hints=hints, filter=GroupFilter(zero_std=False)),
                    prompt_format=prompt_format)
    m.configure_model()
    return m


def _prompt_ids(rollout):
    """Each row's prompt token ids without the left padding."""
    ids = rollout.input_ids[:, : rollout.prompt_len]
    keep = rollout.attention_mask[:, : rollout.prompt_len].bool()
    return [row[k].tolist() for row, k in zip(ids, keep, strict=True)]


def test_chat_rows_get_exactly_the_templated_token_ids(chat_model_dir):
    m = _module(chat_model_dir, ChatPrompt(system_prompt="Be brief."))
    calls = []
    render = m.tokenizer.apply_chat_template
    m.tokenizer.apply_chat_template = lambda *a, **k: (calls.append(a[0]), render(*a, **k))[1]
    step = prepared(m, EASY[:2])
    tok = PreTrainedTokenizerFast.from_pretrained(chat_model_dir)
    start, end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    for g, ids in enumerate(_prompt_ids(step.rollout)):
        record = EASY[g // 4]
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": record.prompt}]
        expected = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
        assert ids == list(expected)
        assert ids[0] == start and ids.count(start) == 3 and ids.count(end) == 2  # system, user, assistant
        assert tok.decode(ids).endswith(f"{record.prompt}<|im_end|>\n<|im_start|>assistant\n")
    assert len(calls) == 2  # rendered once per distinct prompt, not once per row


def test_hints_change_the_user_message_only(chat_model_dir):
    m = _module(chat_model_dir, ChatPrompt(), hints=("Use steps.",))
    step = prepared(m, EASY[:1])
    text = m.tokenizer.decode(_prompt_ids(step.rollout)[0])
    user = EASY[0].prompt.replace(EASY[0].question, EASY[0].question + " Use steps.", 1)
    assert text == f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def test_plain_format_feeds_the_record_text(chat_model_dir):
    m = _module(chat_model_dir, PlainPrompt())
    step = prepared(m, EASY[:1])
    assert m.tokenizer.decode(_prompt_ids(step.rollout)[0]) == EASY[0].prompt


def test_chat_without_a_template_is_a_clear_error(tiny_model_dir):
    with pytest.raises(ValueError, match=r"data/prompt_format=chat needs a tokenizer with a chat template, "
                                         r"and the one at .* has none"):
        _module(tiny_model_dir, ChatPrompt())


CONVERSATIONS = [
    {"prompt": [{"role": "system", "content": "Answer with a number."},
                {"role": "user", "content": "What is 2 + 3?"}], "answer": "5", "level": 1, "source": "a"},
    {"prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "What is 4 + 4?"}], "answer": "8", "level": 2, "source": "b"},
]


def _conversational_source(tmp_path, rows):
    from grpo_aug.data.dataset import DatasetSource

    path = tmp_path / "conv.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return DatasetSource(str(path), columns={"question": "prompt", "difficulty": "level"}), path


def test_conversational_rows_render_every_message_and_the_datas_system_wins(tmp_path, chat_model_dir):
    records = _conversational_source(tmp_path, CONVERSATIONS)[0].load()
    assert records[0].question == records[0].prompt == "What is 2 + 3?"
    assert records[0].context == (("system", "Answer with a number."),)
    assert records[1].context == (("user", "Hi"), ("assistant", "Hello."))
    assert records[1].columns == {"answer": "8", "level": 2, "source": "b"}  # every column but the prompt
    tok = PreTrainedTokenizerFast.from_pretrained(chat_model_dir)
    fmt = ChatPrompt(system_prompt="Be brief.").bind(tok)
    texts = fmt([r.prompt for r in records], [r.context for r in records])
    # the template applied to the rows as written; row 1 has no system message, so system_prompt leads
    expected = [tok.apply_chat_template(CONVERSATIONS[0]["prompt"], tokenize=False, add_generation_prompt=True),
                tok.apply_chat_template([{"role": "system", "content": "Be brief."}, *CONVERSATIONS[1]["prompt"]],
                                        tokenize=False, add_generation_prompt=True)]
    assert texts == expected
    assert texts[0].count("<|im_start|>system") == 1 and "Be brief." not in texts[0]
    with pytest.raises(ValueError, match="data/prompt_format=chat"):
        PlainPrompt()([r.prompt for r in records], [r.context for r in records])


@pytest.mark.parametrize("bad,what", [
    ([{"role": "user"}], "message 0"),
    ([{"role": "robot", "content": "x"}], "message 0"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "must end with a non-empty user"),
    ([], "must end with a non-empty user"),
])
def test_bad_conversations_are_named_by_file_and_line(tmp_path, bad, what):
    from grpo_aug.data.gsm8k import BadRow

    source, path = _conversational_source(tmp_path, [CONVERSATIONS[0], {**CONVERSATIONS[1], "prompt": bad}])
    with pytest.raises(BadRow, match=rf"{path}:2: column 'prompt' {what}"):
        source.load()


SHOT = {"user": "What is 38 + 7 - 4 + 12?", "assistant": "38 + 7 = 45\n45 - 4 = 41\n41 + 12 = 53\nThe answer is 53."}


def test_examples_are_earlier_turns_after_the_system_message_and_before_the_rows_own(tmp_path, chat_model_dir):
    records = _conversational_source(tmp_path, CONVERSATIONS)[0].load()
    tok = PreTrainedTokenizerFast.from_pretrained(chat_model_dir)
    fmt = ChatPrompt(system_prompt="Be brief.", examples=[SHOT]).bind(tok)
    texts = fmt([r.prompt for r in records], [r.context for r in records])
    shot = [{"role": "user", "content": SHOT["user"]}, {"role": "assistant", "content": SHOT["assistant"]}]
    # written out by hand: the data's system message (row 0) or system_prompt (row 1), the example, the row
    expected = [[CONVERSATIONS[0]["prompt"][0], *shot, CONVERSATIONS[0]["prompt"][1]],
                [{"role": "system", "content": "Be brief."}, *shot, *CONVERSATIONS[1]["prompt"]]]
    assert texts == [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in expected]
    assert texts[1].index("41 + 12 = 53") < texts[1].index("<|im_start|>user\nHi")
    assert fmt.conversation(records[1]) == expected[1]  # what rewards that read the messages see


def test_examples_reach_the_rollouts_token_ids(chat_model_dir):
    m = _module(chat_model_dir, ChatPrompt(examples=[SHOT]))
    step = prepared(m, EASY[:1])
    text = m.tokenizer.decode(_prompt_ids(step.rollout)[0])
    assert text == (f"<|im_start|>user\n{SHOT['user']}<|im_end|>\n"
                    f"<|im_start|>assistant\n{SHOT['assistant']}<|im_end|>\n"
                    f"<|im_start|>user\n{EASY[0].prompt}<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("bad", [[{"user": "q"}], [{"user": "q", "assistant": " "}], ["q"],
                                 [SHOT, {"user": "q", "assistant": "a", "system": "s"}]])
def test_a_malformed_example_is_named(bad):
    with pytest.raises(ValueError, match=rf"data.prompt_format.examples\[{len(bad) - 1}\] must be"):
        ChatPrompt(examples=bad)
