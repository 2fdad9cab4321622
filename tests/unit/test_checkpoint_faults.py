"""Checkpoints that cannot be trusted: cut short by a kill mid-save, or holding pickled code."""

from __future__ import annotations

import pytest
import torch

from grpo_aug.resume import latest_checkpoint, read_checkpoint
from helpers import run_train


class Hook:
    """Stands in for any object a checkpoint could carry: unpickling it imports and runs its code."""


def _checkpoint(path, step=3):
    torch.save({"global_step": step, "state_dict": {"policy.w": torch.randn(256, 256)}}, path)
    return path


def test_a_cut_short_checkpoint_is_named_and_said_to_be_cut_short(tmp_path):
    path = _checkpoint(tmp_path / "step-3.ckpt")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"ckpt_path='.*step-3.ckpt': the checkpoint is cut short") as err:
        read_checkpoint(path)
    assert f"{len(data) // 2} bytes" in str(err.value)
    with pytest.raises(ValueError, match="model.name_or_path='.*': the checkpoint is cut short"):
        read_checkpoint(path, "model.name_or_path")
    # resume=auto passes over it to the newest readable one
    _checkpoint(tmp_path / "step-2.ckpt", step=2)
    assert latest_checkpoint(tmp_path) == tmp_path / "step-2.ckpt"


def test_a_checkpoint_holding_pickled_objects_is_refused(tmp_path):
    path = tmp_path / "odd.ckpt"
    torch.save({"global_step": 1, "hook": Hook()}, path)
    with pytest.raises(ValueError, match="cannot read the checkpoint .*Weights only load failed"):
        read_checkpoint(path)
    assert read_checkpoint(_checkpoint(tmp_path / "ok.ckpt"))["global_step"] == 3


def test_the_entry_point_stops_on_a_cut_short_ckpt_path_before_loading_a_model(tmp_path):
    path = _checkpoint(tmp_path / "last.ckpt")
    path.write_bytes(path.read_bytes()[:1000])
    result = run_train(tmp_path, ["debug=fast", f"ckpt_path={path}"])
    assert result.returncode != 0
    said = f"ckpt_path='{path}': the checkpoint is cut short or not a checkpoint (1000 bytes"
    assert said in result.stderr, result.stderr[-2000:]
    assert "PytorchStreamReader" not in result.stderr
    assert not (tmp_path / "cache").exists()
