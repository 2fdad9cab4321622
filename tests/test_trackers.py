"""logger=wandb (offline) and logger=mlflow (a local SQLite store) next to TensorBoard: a short run,
then what each tracker wrote, read back from its own files (W&B's record log, MLflow's client),
against TensorBoard's scalars."""

import json
import re
import struct
from pathlib import Path

import pytest

from helpers import TINY, read_scalars, train_here

wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2", reason="pip install -e '.[wandb]'")
mlflow = pytest.importorskip("mlflow", reason="pip install -e '.[mlflow]'")


def wandb_records(path: Path):
    """The protobuf records of a .wandb file: LevelDB's log format (a 7-byte file header, then
    32 KiB blocks of records, each with a 7-byte header: crc, length, type full/first/middle/last)."""
    data, block, pos, parts = path.read_bytes(), 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 2):
            parts = chunk
        elif kind in (3, 4):
            parts += chunk
        if kind in (1, 4):
            record = wandb_pb.Record()
            record.ParseFromString(parts)
            yield record


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trackers")
    train_here(tmp, ["debug=fast", *TINY, "rollout.filter.zero_std=false", "logger=[tensorboard,wandb,mlflow]"])
    return tmp / "run"


def _by_step(pairs):
    return sorted((int(s), round(float(v), 5)) for s, v in pairs)


def test_wandb_gets_every_scalar_tag_the_config_and_sample_tables(run):
    tb = read_scalars(run)
    [log] = list(run.glob("wandb/offline-run-*/run-*.wandb"))
    history, config = {}, {}
    for record in wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            step = row.get("trainer/global_step")
            for key, value in row.items():
                history.setdefault(key, []).append((step, value))
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
    assert len(tb) > 60 and "eval/accuracy/easy" in tb and "health/kl_mean" in tb
    for tag, pairs in tb.items():
        assert tag in history, tag
        values = [(s, v) for s, v in history[tag]]
        if tag.startswith("final/"):  # TensorBoard files the HPARAMS metrics at step 0
            assert [round(v, 5) for _, v in values] == [round(v, 5) for _, v in pairs], tag
        else:
            assert _by_step(values) == _by_step(pairs), tag
    assert config["algo"]["clip_eps_low"] == 0.2 and config["rollout"]["group_size"] == 4
    buckets = [k.split("/")[1] for k in history if k.startswith("samples/") and k.endswith("/nrows")]
    assert buckets and all(v > 0 for b in buckets for _, v in history[f"samples/{b}/nrows"])
    table = json.loads(next(log.parent.glob("files/media/table/samples/*.table.json")).read_text())
    assert table["columns"] == ["prompt", "completion", "temperature", "reward", "advantage"]
    assert table["data"] and all(r[0].startswith("Q: ") for r in table["data"])


def test_mlflow_gets_every_scalar_tag_the_config_and_sample_tables(run):
    from mlflow.tracking import MlflowClient

    tb = read_scalars(run)
    client = MlflowClient(tracking_uri=f"sqlite:///{run}/mlflow.db")
    [found] = client.search_runs([client.get_experiment_by_name("grpo").experiment_id])
    run_id = found.info.run_id
    for tag, pairs in tb.items():
        key = re.sub(r"[^a-zA-Z0-9_/. -]+", "", tag)  # what MLflow accepts of a name
        history = [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
        if tag.startswith("final/"):
            assert [round(v, 5) for _, v in history] == [round(v, 5) for _, v in pairs], tag
        else:
            assert _by_step(history) == _by_step(pairs), tag
    params = found.data.params
    assert params["algo/clip_eps_low"] == "0.2" and params["rollout/group_size"] == "4"
    tables = [a.path for d in client.list_artifacts(run_id, "samples") for a in client.list_artifacts(run_id, d.path)]
    assert tables and all(t.endswith(".json") for t in tables)
    local = Path(client.download_artifacts(run_id, tables[0]))
    table = json.loads(local.read_text())
    assert table["columns"] == ["prompt", "completion", "temperature", "reward", "advantage"] and table["data"]
