"""The policy's log-probability of a reference solution, against a token-by-token loop."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_aug.prompts.likelihood import reference_logprobs


def _by_hand(model, tok, prompt, reference, max_tokens):
    """One unpadded forward per target token: log softmax of the logits after each prefix."""
    ids = tok(prompt, add_special_tokens=False).input_ids
    target = tok(reference, add_special_tokens=False).input_ids[: max_tokens - 1] + [tok.eos_token_id]
    total = 0.0
    for t in target:
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        total += torch.log_softmax(logits.double(), -1)[t].item()
        ids = ids + [t]
    return total


def test_reference_logprobs_match_a_token_by_token_loop(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.train()
    prompts = ["Q: What is 3 + 4?\nA: ", "Q: What is 12 + 9 - 5?\nA: ", "Q: 1?\nA: "]  # lengths differ: padding
    references = ["3 + 4 = 7\n#### 7", "12 + 9 = 21\n21 - 5 = 16\n#### 16", "#### 1"]
    got = reference_logprobs(model, tok, prompts, references, max_tokens=12)  # the second is cut at 11 + EOS
    assert model.training  # dropout off while scoring, and back on after
    model.eval()
    with torch.no_grad():
        want = [_by_hand(model, tok, p, r, 12) for p, r in zip(prompts, references, strict=True)]
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) < 1e-4
