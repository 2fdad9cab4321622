import shutil

import torch
from safetensors.torch import load_file, save_file

import grpo_aug.warmup.supervised as warmup_lib
from grpo_aug.data.records import Prompt
from grpo_aug.models.loading import load_tokenizer
from grpo_aug.models.settings import WarmupSettings
from grpo_aug.models.tiny import build_tiny_model
from grpo_aug.warmup.supervised import model_key, off_by_one, sft_batch, supervised_warmup


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


def _records():
    from grpo_aug.data.synthetic import SyntheticArithmetic

    return [r for r in SyntheticArithmetic(size_per_bucket=20, seed=0).load() if r.bucket == "easy"]


WARMUP = WarmupSettings(steps=3, lr=1e-3, batch_size=4, buckets=("easy",), off_by_one=0.5)


def test_a_copied_cache_is_reused_without_rebuilding(tmp_path, monkeypatch):
    # the tiny model and its warm-up built in one cache folder, then the folder copied elsewhere (a
    # moved checkout, another paths.cache_dir): the copy's warm-up is found under the same name
    first = tmp_path / "a" / "cache"
    base = build_tiny_model(first, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    built = supervised_warmup(base, _records(), first, WARMUP, seed=0)
    moved = tmp_path / "b" / "elsewhere"
    shutil.copytree(first, moved)
    first_files = {p.relative_to(first): p.read_bytes() for p in first.rglob("*") if p.is_file()}
    shutil.rmtree(tmp_path / "a")  # nothing may point back at the old place

    def no_training(*args, **kwargs):
        raise AssertionError("the warm-up was rebuilt")

    monkeypatch.setattr(warmup_lib, "load_policy", no_training)
    base_moved = build_tiny_model(moved, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    assert base_moved.parent == moved
    reused = supervised_warmup(base_moved, _records(), moved, WARMUP, seed=0)
    assert reused == moved / built.name
    assert {p.relative_to(moved): p.read_bytes() for p in moved.rglob("*") if p.is_file()} == first_files


def test_the_warmup_key_follows_content_not_paths(tmp_path):
    one = build_tiny_model(tmp_path / "one", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    two = build_tiny_model(tmp_path / "two", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    other_seed = build_tiny_model(tmp_path / "three", hidden_size=32, num_layers=2, num_heads=2,
                                  intermediate_size=64, seed=1)
    assert model_key(one) == model_key(two)  # a rebuild writes the same bytes
    (two / ".cache" / "huggingface").mkdir(parents=True)  # download metadata of a --local-dir copy
    (two / ".cache" / "huggingface" / "model.safetensors.metadata").write_text("etag 1764806400")
    assert model_key(one) == model_key(two)
    assert model_key(one) != model_key(other_seed)  # other weights, other key
    assert model_key("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    # one weight changed by a tiny amount changes the key
    weights = one / "model.safetensors"
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] += 1e-3
    save_file(tensors, weights, metadata={"format": "pt"})
    assert model_key(one) != model_key(two)


def test_every_setting_that_shapes_a_warmup_is_in_its_cache_key(tmp_path):
    """A warm-up built with any of its inputs changed lands in a directory of its own: a key that
    left one out would hand a later run the stale weights of another recipe."""
    import dataclasses
    from types import SimpleNamespace

    cache = tmp_path / "cache"
    base = build_tiny_model(cache, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    records = _records()
    built = supervised_warmup(base, records, cache, WARMUP, seed=0)
    assert supervised_warmup(base, records, cache, WARMUP, seed=0) == built  # the same recipe: reused
    tools = SimpleNamespace(active=True, warmup_share=0.5, call="[", end="]", result="={output}")
    edited = [dataclasses.replace(records[0], prompt=records[0].prompt + " "), *records[1:]]
    other_base = build_tiny_model(cache, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=1)
    variants = {
        "lr": dict(settings=dataclasses.replace(WARMUP, lr=2e-3)),
        "steps": dict(settings=dataclasses.replace(WARMUP, steps=4)),
        "batch_size": dict(settings=dataclasses.replace(WARMUP, batch_size=5)),
        "off_by_one": dict(settings=dataclasses.replace(WARMUP, off_by_one=0.6)),
        "warmup seed": dict(settings=dataclasses.replace(WARMUP, seed=3)),
        "run seed": dict(seed=1),
        "data": dict(records=edited),
        "tool share": dict(tools=tools),
        "base model": dict(base=other_base),
    }
    seen = {built}
    for name, change in variants.items():
        out = supervised_warmup(change.get("base", base), change.get("records", records), cache,
                                change.get("settings", WARMUP), seed=change.get("seed", 0), tools=change.get("tools"))
        assert out not in seen, f"changing the {name} reused another recipe's warm-up"
        seen.add(out)
