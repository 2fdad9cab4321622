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


def test_length_grouped_batches_hold_similar_lengths_and_cover_the_draw_once():
    import random

    from grpo_aug.models.warmup import length_grouped

    # three tiers of lengths, 8 of each: a window of 3 batches of 8 draws all 24, and sorting by
    # length puts each tier in a batch of its own
    lengths = [10] * 8 + [20] * 8 + [30] * 8
    batches = length_grouped(lengths, batch_size=8, rng=random.Random(1), window=3)
    assert sorted(i for b in batches for i in b) == list(range(24))
    assert sorted({lengths[i] for i in b}.pop() for b in batches) == [10, 20, 30]
    assert all(len({lengths[i] for i in b}) == 1 for b in batches)
    # a window larger than the pool: every index once, the last batch short
    short = length_grouped([5, 1, 3, 2, 4], batch_size=2, rng=random.Random(0), window=8)
    assert sorted(len(b) for b in short) == [1, 2, 2]
    assert sorted(i for b in short for i in b) == [0, 1, 2, 3, 4]
    assert sorted(sorted(lengths_of) for lengths_of in ([[5, 1, 3, 2, 4][i] for i in b] for b in short)) == [
        [1, 2], [3, 4], [5]]
