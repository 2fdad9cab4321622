"""A reward model as a reward: a tiny sequence classifier saved to a temporary directory, its
batched, padded scores checked against a forward on each row alone."""

import math

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

from grpo_aug.data.records import Prompt
from grpo_aug.rewards import ModelReward, RewardFunction, RewardSet
from helpers import build_chat_model

TEXT = [Prompt("t1", "2+3?", "Q: 2+3?\nA: ", "5", "5", "easy"), Prompt("t2", "4+4?", "Q: 4+4?\nA: ", "8", "8", "easy")]
CHAT = [Prompt("c1", "2+3?", "2+3?", "5", "5", "easy", context=(("system", "Be brief."),)),
        Prompt("c2", "9-1?", "9-1?", "8", "8", "easy", context=())]
COMPLETIONS = [["5", "The sum is 5 I think", "4"], ["8", "eight"]]


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("rm")
    build_chat_model(out / "chat")  # its tokenizer (with a chat template) serves the classifier
    tok = AutoTokenizer.from_pretrained(out / "chat")
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, num_labels=1, pad_token_id=tok.pad_token_id)
    torch.manual_seed(1)
    LlamaForSequenceClassification(config).save_pretrained(out / "rm")
    tok.save_pretrained(out / "rm")
    return out / "rm"


def _alone(path, text: str) -> float:
    """The first logit of one unpadded sequence: no batching, no padding, nothing to find."""
    tok = AutoTokenizer.from_pretrained(path)
    model = LlamaForSequenceClassification.from_pretrained(path).eval()
    ids = torch.tensor([tok(text, add_special_tokens=False).input_ids])
    with torch.no_grad():
        return float(model(input_ids=ids).logits[0, 0])


def test_scores_equal_a_forward_on_each_row_alone(classifier_dir):
    rm = ModelReward(str(classifier_dir), batch_size=2, shift=0.5, scale=2.0)  # 3 batches for 5 rows, padded
    rows = [p for p, row in zip(TEXT, [COMPLETIONS[0], COMPLETIONS[1]], strict=True) for _ in row]
    texts = [t for row in COMPLETIONS for t in row]
    got = rm(rows, texts)
    expected = [(_alone(classifier_dir, p.prompt + t) - 0.5) / 2.0 for p, t in zip(rows, texts, strict=True)]
    assert got == pytest.approx(expected, abs=1e-5)
    squashed = ModelReward(str(classifier_dir), sigmoid=True)(rows, texts)
    assert squashed == pytest.approx([1 / (1 + math.exp(-_alone(classifier_dir, p.prompt + t)))
                                      for p, t in zip(rows, texts, strict=True)], abs=1e-5)


def test_conversations_go_through_the_reward_models_chat_template(classifier_dir):
    tok = AutoTokenizer.from_pretrained(classifier_dir)
    rm = ModelReward(str(classifier_dir), batch_size=4)
    rows = [CHAT[0], CHAT[0], CHAT[1]]
    texts = ["5", "It is 5", "8"]
    by_hand = [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"},
         {"role": "assistant", "content": "5"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"},
         {"role": "assistant", "content": "It is 5"}],
        [{"role": "user", "content": "9-1?"}, {"role": "assistant", "content": "8"}],
    ]
    expected = [_alone(classifier_dir, tok.apply_chat_template(m, tokenize=False)) for m in by_hand]
    assert rm(rows, texts) == pytest.approx(expected, abs=1e-5)


def test_in_a_reward_set_with_a_weight_and_bad_paths_named(classifier_dir, tmp_path):
    rm = ModelReward(str(classifier_dir))
    scores = RewardSet([RewardFunction(rm, weight=0.5)]).score(TEXT[:1], [["5", "4"]], [[1], [2]])
    assert scores.parts["reward_model"][0].tolist() == pytest.approx(rm(TEXT[:1] * 2, ["5", "4"]), abs=1e-6)
    assert scores.total[0].tolist() == pytest.approx([0.5 * v for v in scores.parts["reward_model"][0].tolist()])
    with pytest.raises(ValueError, match=f"reward model '{tmp_path}/none': cannot load a sequence classifier"):
        ModelReward(str(tmp_path / "none"))
    with pytest.raises(ValueError, match="scale must be > 0"):
        ModelReward(str(classifier_dir), scale=0.0)
