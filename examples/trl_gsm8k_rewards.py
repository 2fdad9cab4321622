"""Reward functions of a TRL GRPOTrainer GSM8K script, as its user wrote them for TRL: nothing
here knows about grpo-aug. `conf/experiment/trl_gsm8k.yaml` plugs them in by import path:

    python train.py experiment=trl_gsm8k model.name_or_path=<instruct model> \
      reward.functions.2.fn.name_or_path=<reward model>
"""

import re


def extract_hash_answer(text: str) -> str | None:
    if "####" not in text:
        return None
    return text.split("####")[1].strip().replace(",", "")


def correctness_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """2.0 when the last number of the completion equals the GSM8K answer after '####'."""
    responses = [completion[0]["content"] for completion in completions]
    extracted = [re.findall(r"-?\d+(?:\.\d+)?", r.replace(",", "")) for r in responses]
    gold = [extract_hash_answer(a) for a in answer]
    return [2.0 if found and g is not None and float(found[-1]) == float(g) else 0.0
            for found, g in zip(extracted, gold, strict=True)]


def format_reward(completions, **kwargs) -> list[float]:
    """0.5 when the completion puts its reasoning in <think> tags and ends with an <answer>."""
    pattern = r"^<think>.*?</think>\s*<answer>.*?</answer>\s*$"
    contents = [completion[0]["content"] for completion in completions]
    return [0.5 if re.match(pattern, c, re.DOTALL) else 0.0 for c in contents]
