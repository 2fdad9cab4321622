import torch

from grpo_aug.data.records import Prompt
from grpo_aug.models.loading import load_tokenizer
from grpo_aug.models.warmup import off_by_one, sft_batch


def _p(answer, solution):
    return Prompt(id="x", question="q", prompt="Q: q\nA: ", answer=answer, solution=solution, bucket="easy")


def test_off_by_one_raises_the_last_step_and_the_final_line():
    r = off_by_one(_p("55", "<<47+8=55>>55\n#### 55"))
    assert (r.answer, r.solution) == ("56", "<<47+8=56>>56\n#### 56")
    gsm = "48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72 clips.\n#### 72"
    r = off_by_one(_p("72", gsm))
    assert r.solution == "48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=73>>73 clips.\n#### 73"


def test_sft_batch_trains_on_solution_and_eos_only(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    ids, attn, labels = sft_batch(tok, [_p("5", "#### 5"), _p("12", "<<7+5=12>>12\n#### 12")])
    prompt_len = len("Q: q\nA: ")
    for i, solution in enumerate(["#### 5", "<<7+5=12>>12\n#### 12"]):
        n = prompt_len + len(solution) + 1  # one token per character, plus EOS
        assert attn[i].sum() == n
        assert (labels[i, :prompt_len] == -100).all()
        assert tok.decode(labels[i, prompt_len : n - 1]) == solution
        assert labels[i, n - 1] == tok.eos_token_id
        assert (labels[i, n:] == -100).all()
    assert torch.equal(ids[0, :prompt_len], ids[1, :prompt_len])
