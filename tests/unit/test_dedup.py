import pytest
import torch

from grpo_aug.algo import group_advantages, policy_loss
from grpo_aug.rollout.dedup import NgramDedup, jaccard, keep_distinct, word_ngrams
from grpo_aug.rollout.settings import RolloutSettings

BASE = "first we add three and four to get seven then we multiply by two to get fourteen"  # 17 words


def test_jaccard_by_hand():
    # 3-grams of "a b c d": {abc, bcd}; of "a b c e": {abc, bce} -> 1 shared of 3
    assert jaccard(word_ngrams("a b c d", 3), word_ngrams("a b c e", 3)) == pytest.approx(1 / 3)
    assert word_ngrams("too short", 8) == frozenset([("too", "short")])  # compared whole


def test_threshold_both_sides():
    # changing the last word of 17 changes 1 of 10 8-grams: overlap 9 / 11 = 0.818
    edited = BASE.rsplit(" ", 1)[0] + " fifteen"
    assert jaccard(word_ngrams(BASE, 8), word_ngrams(edited, 8)) == pytest.approx(9 / 11)
    assert keep_distinct([BASE, edited], 8, threshold=0.8) == [True, False]  # 0.818 >= 0.8: near-copy
    assert keep_distinct([BASE, edited], 8, threshold=0.9) == [True, True]  # 0.818 < 0.9: distinct


def test_keeps_first_and_distinct_completions():
    texts = ["#### 5", "#### 5", "#### 6", "#### 5", "#### 7"]
    assert keep_distinct(texts, 8, 0.9) == [True, False, True, False, True]


def test_group_with_too_few_distinct_rows_is_dropped_and_adds_nothing_to_the_loss():
    dedup = NgramDedup(ngram=8, threshold=0.9, min_unique=3)
    completions = [["#### 1", "#### 2", "#### 3", "#### 1"], ["#### 4", "#### 4", "#### 5", "#### 4"]]
    distinct = dedup(completions)
    assert distinct.tolist() == [[True, True, True, False], [True, False, True, False]]
    valid = distinct & dedup.groups_kept(distinct)[:, None]
    assert valid.tolist() == [[True, True, True, False], [False] * 4]
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 1.0]])
    adv = group_advantages(rewards, valid)
    assert torch.equal(adv[1], torch.zeros(4)) and adv[0, 3] == 0
    # the loss with the dropped group equals the loss of the kept group alone, halved (mean over rows)
    logps = torch.randn(2, 4, 3, requires_grad=True)
    mask = torch.ones(2, 4, 3) * valid[..., None]
    loss, _ = policy_loss(logps, logps.detach(), logps.detach(), adv, mask)
    alone, _ = policy_loss(logps[:1], logps[:1].detach(), logps[:1].detach(), adv[:1], mask[:1])
    assert torch.allclose(loss, alone / 2)
    loss.backward()
    assert torch.equal(logps.grad[1], torch.zeros(4, 3))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"threshold": 0.0}, "rollout.dedup.threshold"),
        ({"threshold": 1.5}, "rollout.dedup.threshold"),
        ({"min_unique": 1}, "rollout.dedup.min_unique"),
    ],
)
def test_bad_dedup_values_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NgramDedup(**kwargs)


def test_min_unique_above_group_size_fails():
    with pytest.raises(ValueError, match="rollout.dedup.min_unique=5 exceeds rollout.group_size=4"):
        RolloutSettings(group_size=4, dedup=NgramDedup(min_unique=5))
