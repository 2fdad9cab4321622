"""Reward functions written for TRL's GRPOTrainer, used unchanged: the arguments TRL passes, the
same rules as per-row rewards (None, on_error, timeout_s, weights), and the token ids a rollout gives."""

import json
import re
import time

import pytest
import torch

from grpo_aug.data.dataset import DatasetSource
from grpo_aug.data.records import Prompt
from grpo_aug.models.module import GRPOModule
from grpo_aug.rewards import RewardFunction, RewardSet, TRLReward
from grpo_aug.rewards.trl import TrainerState
from grpo_aug.rollout.filter import GroupFilter
from grpo_aug.rollout.settings import RolloutSettings
from helpers import build_chat_model, make_module


# -- written as TRL's documentation writes them (huggingface.co/docs/trl, GRPOTrainer) --------
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def reward_func(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]  # noqa: B905 (as TRL writes it)


def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


CALLS = []


def spy(prompts, completions, completion_ids, trainer_state, **kwargs):
    CALLS.append(dict(prompts=prompts, completions=completions, completion_ids=completion_ids,
                      trainer_state=trainer_state, **kwargs))
    return [None if i == 1 else float(len(ids)) for i, ids in enumerate(completion_ids)]


def _records(tmp_path, conversational: bool):
    rows = [{"prompt": [{"role": "system", "content": "Box it."}, {"role": "user", "content": "2+3?"}]
             if conversational else "2+3?", "answer": "5", "ground_truth": "5", "level": 1},
            {"prompt": [{"role": "user", "content": "4+4?"}] if conversational else "4+4?", "answer": "8",
             "ground_truth": "8", "level": 2}]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return DatasetSource(str(path), columns={"question": "prompt", "difficulty": "level"}).load()


def test_trl_functions_get_the_batch_as_trl_passes_it(tmp_path):
    records = _records(tmp_path, conversational=False)
    texts = [["\\boxed{5}", "so \\boxed{4}"], ["\\boxed{8} and more words here", "8"]]
    ids = [[1, 2], [3], [4, 5, 6], [7, 8, 9, 10]]
    CALLS.clear()
    rewards = RewardSet([RewardFunction(TRLReward(reward_func)), RewardFunction(TRLReward(reward_len), weight=0.5),
                         RewardFunction(TRLReward(spy), weight=0.0)])
    scores = rewards.score(records, texts, ids, TrainerState(global_step=7, max_steps=10))
    # reward_func: boxed 5 == 5, 4 != 5, 8 == 8, none; reward_len: -|20 - len| (lengths 9, 12, 29, 1)
    assert scores.parts["reward_func"].tolist() == [[1.0, 0.0], [1.0, 0.0]]
    assert scores.parts["reward_len"].tolist() == [[-11.0, -8.0], [-9.0, -19.0]]
    assert scores.scored.tolist() == [[True, False], [True, True]]  # spy: None on row 1
    assert torch.allclose(scores.total, torch.tensor([[1 - 5.5, 0.0], [1 - 4.5, -9.5]]))
    call = CALLS[0]
    assert call["prompts"] == ["2+3?", "2+3?", "4+4?", "4+4?"]  # one entry per completion, as TRL
    assert call["completions"] == [t for row in texts for t in row] and call["completion_ids"] == ids
    assert call["ground_truth"] == ["5", "5", "8", "8"] and call["level"] == [1, 1, 2, 2]  # dataset columns
    assert call["trainer_state"].global_step == 7 and call["trainer_state"].max_steps == 10


def test_conversational_rows_pass_messages_and_the_records_own_fields_without_columns(tmp_path):
    records = _records(tmp_path, conversational=True)
    texts = [["<think>a</think><answer>5</answer>", "5"], ["<think>b</think>", "<think></think><answer>8</answer>"]]
    CALLS.clear()
    scores = RewardSet([RewardFunction(TRLReward(format_reward_func)), RewardFunction(TRLReward(spy))]).score(
        records, texts, [[1]] * 4)
    assert scores.parts["format_reward_func"].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    call = CALLS[0]
    assert call["prompts"][0] == [{"role": "system", "content": "Box it."}, {"role": "user", "content": "2+3?"}]
    assert call["prompts"][3] == [{"role": "user", "content": "4+4?"}]
    assert call["completions"][1] == [{"role": "assistant", "content": "5"}]
    built = Prompt("g1", "q", "Q: q\nA: ", "12", "<<3*4=12>>12 #### 12", "easy")  # a record built here
    CALLS.clear()
    RewardSet([RewardFunction(TRLReward(spy))]).score([built], [["x", "y"]], [[1], [2]])
    assert CALLS[0]["answer"] == ["12", "12"] and CALLS[0]["solution"][0] == built.solution
    assert CALLS[0]["prompts"] == ["Q: q\nA: "] * 2 and CALLS[0]["completions"] == ["x", "y"]


def _raises(completions, **kwargs):
    raise KeyError("boom")


def _sleeps(completions, **kwargs):
    time.sleep(30)


def _short(completions, **kwargs):
    return [1.0]


def test_a_raising_hanging_or_malformed_function_follows_the_reward_rules():
    p = Prompt("p1", "q", "q", "1", "1", "easy")
    with pytest.raises(RuntimeError, match=r"reward function '_raises' raised on the step's 2 rows: KeyError"):
        RewardSet([RewardFunction(TRLReward(_raises))]).score([p], [["a", "b"]], [[1], [2]])
    skipped = RewardSet([RewardFunction(TRLReward(_raises))], on_error="skip").score([p], [["a", "b"]], [[1], [2]])
    assert skipped.scored.tolist() == [[False, False]] and skipped.errors == {"_raises": 2}
    timed = RewardSet([RewardFunction(TRLReward(_sleeps)), RewardFunction(TRLReward(reward_len))], timeout_s=0.5)
    try:
        start = time.monotonic()
        scores = timed.score([p], [["a", "b"]], [[1], [2]])
        assert time.monotonic() - start < 5 and scores.timeouts == {"_sleeps": 2, "reward_len": 0}
        assert scores.scored.tolist() == [[False, False]] and scores.parts["reward_len"].tolist() == [[-19.0, -19.0]]
    finally:
        timed.timed.close()
    with pytest.raises(TypeError, match=r"'_short' returned '\[1.0\]' for the step's 2 rows; expected a list of 2"):
        RewardSet([RewardFunction(TRLReward(_short))]).score([p], [["a", "b"]], [[1], [2]])


def test_functions_by_import_path_and_bad_paths_fail_before_training():
    assert TRLReward("examples.trl_gsm8k_rewards.format_reward").name == "format_reward"
    with pytest.raises(ValueError, match=r"'examples.trl_gsm8k_rewards.nope' cannot be imported"):
        TRLReward("examples.trl_gsm8k_rewards.nope")
    with pytest.raises(ValueError, match="expected an import path"):
        TRLReward("reward_len")


def _spied_module(path, group_size: int, prompt_format=None) -> GRPOModule:
    """A module on the chat model whose only reward is `spy`."""
    CALLS.clear()
    m = make_module(path, RewardSet([RewardFunction(TRLReward(spy))]),
                    RolloutSettings(group_size=group_size, temperatures=(1.0,), top_p=1.0, max_new_tokens=6,
                                    filter=GroupFilter(zero_std=False)), prompt_format=prompt_format)
    m.configure_model()
    return m


def test_the_rollout_passes_each_completions_token_ids(tmp_path):
    m = _spied_module(build_chat_model(tmp_path / "chat"), group_size=3)
    prompts = [Prompt(f"p{i}", f"{i}+1?", f"Q: {i}+1?\nA: ", str(i + 1), str(i + 1), "easy") for i in range(2)]
    sampled = m.rollout.sample_round(m.policy, prompts, torch.Generator().manual_seed(0),
                                     TrainerState(3, 9))
    ro = sampled.rollout
    expected = [row[mask.bool()].tolist() for row, mask in zip(ro.input_ids[:, ro.prompt_len :], ro.completion_mask,
                                                                   strict=True)]
    assert CALLS[0]["completion_ids"] == expected and CALLS[0]["completions"] == ro.texts
    lengths = ro.completion_mask.sum(dim=1).float().view(2, 3)
    assert torch.equal(sampled.parts["spy"][0, [0, 2]], lengths[0, [0, 2]]) and sampled.parts["spy"][0, 1].isnan()


def test_under_the_chat_template_rewards_see_the_messages_the_model_saw(tmp_path):
    from grpo_aug.data.prompt_format import ChatPrompt

    m = _spied_module(build_chat_model(tmp_path / "chat"), 2, ChatPrompt(system_prompt="Be brief."))
    text = Prompt("t", "2+3?", "2+3?", "5", "5", "easy")  # a text record, rendered as a chat
    conv = Prompt("c", "4+4?", "4+4?", "8", "8", "easy", context=(("system", "Use steps."),))
    sampled = m.rollout.sample_round(m.policy, [text, conv], torch.Generator().manual_seed(0))
    call = CALLS[0]
    brief = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    assert call["prompts"][:2] == [brief, brief]
    assert call["prompts"][2] == [{"role": "system", "content": "Use steps."}, {"role": "user", "content": "4+4?"}]
    assert call["completions"] == [[{"role": "assistant", "content": t}] for t in sampled.rollout.texts]


def test_the_ported_gsm8k_rewards_by_hand():
    from examples.trl_gsm8k_rewards import correctness_reward, format_reward

    def chat(text):
        return [{"role": "assistant", "content": text}]

    answers = ["Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"] * 3 + ["... #### 1,200"]
    completions = [chat("<think>48 + 24</think> <answer>72</answer>"), chat("so 71 or 72.5"), chat("no number"),
                   chat("It is 1,200.")]
    # the last number of each completion against the number after '####' (commas dropped)
    assert correctness_reward(None, completions, answers) == [2.0, 0.0, 0.0, 2.0]
    assert format_reward(completions) == [0.5, 0.0, 0.0, 0.0]
    assert format_reward([chat("<think>a\nb</think>\n<answer>3</answer>\n")]) == [0.5]
