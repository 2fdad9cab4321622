import pytest
import torch

from grpo_aug.engines.rows import concat_rollouts, select_rows
from grpo_aug.engines.sampling import generate
from grpo_aug.fast_llama.logprobs import token_logprobs
from grpo_aug.models.loading import load_policy, load_tokenizer
from grpo_aug.rollout.filter import GroupFilter, informative_groups


def test_informative_groups_by_hand():
    rewards = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 0.0, 1.0], [0.5, 0.5, 0.2]])
    valid = torch.tensor([[True] * 3, [True] * 3, [True, False, False], [True, True, False]])
    # flat; spread; only one counted row; spread only in an uncounted row
    assert informative_groups(rewards, valid).tolist() == [False, True, False, False]


def test_bad_filter_settings_name_the_key():
    with pytest.raises(ValueError, match="rollout.filter.refill needs rollout.filter.zero_std"):
        GroupFilter(zero_std=False, refill=True)
    with pytest.raises(ValueError, match="rollout.filter.max_rounds"):
        GroupFilter(zero_std=True, max_rounds=-1)


def test_merged_rollouts_score_like_their_parts(tiny_model_dir):
    torch.manual_seed(0)
    model, tok = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    a = generate(model, tok, ["Q: 1?\nA: ", "Q: What is 47 + 8?\nA: "], torch.tensor([1.0, 0.7]), 1.0, 4)
    b = generate(model, tok, ["Q: What is 120 + 7 + 9?\nA: "], torch.tensor([1.5]), 1.0, 7)
    merged = concat_rollouts([a, b], tok.pad_token_id)
    assert merged.prompt_len == b.prompt_len and merged.completion_mask.shape[1] == max(
        a.completion_mask.shape[1], b.completion_mask.shape[1])
    with torch.no_grad():
        whole = token_logprobs(model, merged.input_ids, merged.attention_mask, merged.prompt_len, merged.temperatures)
        for part, rows in ((a, [0, 1]), (b, [2])):
            own = token_logprobs(model, part.input_ids, part.attention_mask, part.prompt_len, part.temperatures)
            t = part.completion_mask.shape[1]
            m = part.completion_mask.bool()
            assert torch.allclose(whole[rows, :t][m], own[m], atol=1e-4)
    picked = select_rows(merged, torch.tensor([2, 0]))
    assert picked.texts == [b.texts[0], a.texts[0]]
    assert torch.equal(picked.input_ids[1], merged.input_ids[0])
