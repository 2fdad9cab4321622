"""rollout/engine=vllm_server without vLLM: its failures, each a ServerError naming the server's URL,
against a scripted HTTP server on localhost (tests/with_vllm run the real one)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
import torch

from grpo_aug.engines.vllm_server import PROBE, VLLMServerEngine
from grpo_aug.engines.weight_sync import FileSync
from grpo_aug.errors import ServerError
from helpers import free_port


class Scripted(BaseHTTPRequestHandler):
    """Answers as a vLLM server would, except where `self.server.script` says otherwise."""

    def log_message(self, *args):
        pass

    def answer(self, body):
        script = self.server.script
        path = self.path.split("?")[0]
        self.server.seen.append((path, body))
        if path in script.get("sleep", {}):
            time.sleep(script["sleep"][path])
        if path in script.get("fail", {}):
            self.send_response(script["fail"][path])
            self.end_headers()
            self.wfile.write(b'{"error": "scripted failure"}')
            return
        model = script.get("model", "m")
        reply = {"/health": None, "/v1/models": {"data": [{"id": model, "root": model}]},
                 "/tokenize": {"tokens": script.get("tokens", [1, 2, 3])}}.get(path, {})
        self.send_response(200)
        self.end_headers()
        if reply is not None:
            self.wfile.write(json.dumps(reply).encode())

    def do_GET(self):
        self.answer(None)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        self.answer(json.loads(self.rfile.read(length) or b"null"))


@pytest.fixture
def fake():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    server.script, server.seen = {}, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def url_of(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"



def tokenizer(ids):
    return lambda text, add_special_tokens=False: SimpleNamespace(input_ids=ids if text == PROBE else [])


def test_a_server_that_is_not_there_fails_within_the_connect_timeout_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    engine = VLLMServerEngine(url=url, connect_timeout_s=1.0)
    began = time.monotonic()
    with pytest.raises(ServerError, match=f"vLLM server at {url} not reachable within 1 s"):
        engine.setup("m", tokenizer([1, 2, 3]), seed=0)
    assert time.monotonic() - began < 10


def test_another_model_or_another_tokenizer_is_refused_at_start(fake):
    fake.script["model"] = "Qwen/Qwen2.5-7B"
    with pytest.raises(ServerError, match=r"serves \['Qwen/Qwen2.5-7B'\], not the trainer's model 'm'"):
        VLLMServerEngine(url=url_of(fake)).setup("m", tokenizer([1, 2, 3]), seed=0)
    fake.script["model"], fake.script["tokens"] = "m", [1, 2, 4]
    with pytest.raises(ServerError, match="tokenizes differently"):
        VLLMServerEngine(url=url_of(fake)).setup("m", tokenizer([1, 2, 3]), seed=0)
    # the same weights under another name: named in served_model
    fake.script["model"], fake.script["tokens"] = "alias", [1, 2, 3]
    engine = VLLMServerEngine(url=url_of(fake), served_model="alias")
    engine.setup("/some/local/copy", tokenizer([1, 2, 3]), seed=0)
    assert engine.model == "alias"


def ready(fake, tmp_path, timeout_s=300.0) -> VLLMServerEngine:
    engine = VLLMServerEngine(url=url_of(fake), weight_sync=FileSync(str(tmp_path / "w"), timeout_s=timeout_s))
    engine.setup("m", tokenizer([1, 2, 3]), seed=0)
    return engine


def test_a_push_writes_the_weights_then_reloads_resets_the_cache_and_sets_the_version(fake, tmp_path):
    from safetensors.torch import load_file

    engine = ready(fake, tmp_path)
    policy = torch.nn.Linear(3, 2)
    engine.sync(policy, 7)
    engine.sync(policy, 7)  # once per step
    pushes = [(p, b) for p, b in fake.seen if p not in ("/health", "/v1/models", "/tokenize")]
    reload = {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "w")}}
    assert pushes == [("/collective_rpc", reload),
                      ("/reset_prefix_cache", {}), ("/update_weight_version", {"new_version": "7"})]
    written = load_file(str(tmp_path / "w" / "model.safetensors"))
    assert torch.equal(written["weight"], policy.weight) and torch.equal(written["bias"], policy.bias)


def test_a_failed_or_hung_push_stops_with_the_url_and_the_step(fake, tmp_path):
    engine = ready(fake, tmp_path, timeout_s=1.0)
    fake.script["fail"] = {"/collective_rpc": 500}
    with pytest.raises(ServerError, match=rf"{url_of(fake)}: the weight push of step 3 .* HTTP 500"):
        engine.sync(torch.nn.Linear(3, 2), 3)
    fake.script["fail"], fake.script["sleep"] = {}, {"/collective_rpc": 3.0}
    began = time.monotonic()
    with pytest.raises(ServerError, match=rf"{url_of(fake)} did not answer the weight push of step 4 .*resume=auto"):
        engine.sync(torch.nn.Linear(3, 2), 4)
    assert time.monotonic() - began < 2.9  # the push's own timeout, not the server's pace


def test_a_server_that_stops_answering_mid_rollout_names_the_url_and_the_resume(fake, tmp_path):
    engine = ready(fake, tmp_path)
    fake.shutdown()
    fake.server_close()
    with pytest.raises(ServerError, match=rf"{url_of(fake)} did not answer a rollout request .*resume=auto"):
        engine.generate(torch.nn.Linear(1, 1), tokenizer([1]), [[5, 6]], torch.ones(1), 1.0, 4)
