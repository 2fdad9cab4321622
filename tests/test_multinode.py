"""A multi-node rehearsal on one machine: two `torchrun --nnodes=2 --nproc_per_node=1` launches
(node ranks 0 and 1, gloo on localhost), each with its own run directory as on two machines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, TINY, all_finite, free_port, read_scalars


@pytest.mark.slow
@pytest.mark.parametrize("trainer", [["trainer=ddp"], ["trainer=fsdp", "trainer.precision=32-true"]],
                         ids=["ddp", "fsdp2"])
def test_two_torchrun_nodes_agree_on_every_decision_and_one_writes(tmp_path, trainer):
    port = free_port()
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([str(ROOT / "tests"),
                                                                          os.environ.get("PYTHONPATH", "")]))
    nodes = []
    for node in (0, 1):
        args = [str(torchrun), "--nnodes=2", "--nproc_per_node=1", f"--node_rank={node}", "--master_addr=127.0.0.1",
                f"--master_port={port}", str(ROOT / "train.py"), f"hydra.run.dir={tmp_path}/node{node}",
                f"paths.cache_dir={tmp_path}/cache{node}", "debug=fast", *TINY, *trainer, "trainer.accelerator=cpu",
                "trainer.devices=1", "trainer.num_nodes=2", "reward=similarity", "rollout.filter.zero_std=true",
                "rollout.filter.refill=true", "+callbacks.decisions._target_=helpers.DecisionLog",
                f"+callbacks.decisions.out={tmp_path}/decisions"]
        nodes.append(subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    said = [p.communicate(timeout=600)[0] for p in nodes]
    for p, out in zip(nodes, said, strict=True):
        assert p.returncode == 0, out[-3000:]
    decisions = [json.loads((tmp_path / "decisions" / f"decisions-rank{r}.json").read_text()) for r in (0, 1)]
    assert decisions[0] == decisions[1] and len(decisions[0]) == 4
    # the global-zero node writes the logs, checkpoints and the final policy; the other none of them
    scalars = read_scalars(tmp_path / "node0")
    assert all_finite(scalars["train/loss"]) and [s for s, _ in scalars["eval/accuracy/easy"]] == [0, 2, 4]
    assert (tmp_path / "node0" / "checkpoints" / "last.ckpt").is_file()
    assert (tmp_path / "node0" / "policy" / "config.json").is_file()
    written = {p.name for p in (tmp_path / "node1").rglob("*") if p.is_file()}
    assert not written & {"last.ckpt", "config.json"} and not list((tmp_path / "node1").rglob("events.out.*"))
