"""FSDP on a real GPU: a few steps of the tiny model with the reference sharded like the policy.
Skipped without CUDA; scripts/gpu_check.sh runs it."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


def test_fsdp_trains_a_few_steps(tmp_path):
    from helpers import TINY, all_finite, read_scalars, run_train

    result = run_train(tmp_path, ["debug=fast", *TINY, "trainer=fsdp", "trainer.devices=1",
                                  "rollout.filter.zero_std=false"])
    assert result.returncode == 0, result.stderr[-3000:]
    scalars = read_scalars(tmp_path / "run")
    assert all_finite(scalars["train/loss"]) and all_finite(scalars["health/kl_mean"])
