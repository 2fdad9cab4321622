"""`rollout/engine=vllm_server`: the engine is a separate `vllm serve` process, reached over HTTP.

The user starts it (`url`), or the trainer does (`launch: true`, on the devices the config names,
with vLLM's dev routes on: VLLM_SERVER_DEV_MODE=1). Every rank of a DDP or FSDP2 trainer sends its
own rows to the one server; rank 0 alone pushes the weights (every rank takes part in gathering
them under FSDP2), and the others wait for the push at a barrier.

    generation  /v1/completions, one request per row with its token ids, temperature, seed and
                options, `logprobs: 0` and `return_token_ids`; the server runs with
                `--logprobs-mode processed_logprobs` (the log-prob after temperature), so rows
                come back as the colocated engine returns them
    weights     after each optimizer step, through the `rollout/engine/weight_sync` option:
                `file` (the policy written as safetensors, reloaded in place through the dev
                route /collective_rpc reload_weights; runs on CPUs and GPUs) or `nccl` (vLLM's
                native weight-transfer API, NCCL from trainer rank 0 to the server's workers;
                GPU only)

Failures stop the run with the server's URL named (`ServerError`): not reachable at start,
another model or tokenizer than the trainer's, a push that fails or times out, a server that
stops answering mid-run. Checkpoints already written resume the run once the server is back.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from grpo_aug.distributed import first_process, rank_world
from grpo_aug.engines.sampling_options import SamplingOptions
from grpo_aug.engines.types import Rollout, rollout_from_ids
from grpo_aug.engines.weight_sync import FileSync
from grpo_aug.errors import ServerError, UsageError

log = logging.getLogger(__name__)

PROBE = "The quick brown fox: 12 + 30 = 42.\n#### 42"  # the tokenizer check's text


class Server:
    """The HTTP side: JSON requests with timeouts, every failure a ServerError naming the URL."""

    def __init__(self, url: str, connect_timeout_s: float, request_timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.connect_timeout_s, self.request_timeout_s = connect_timeout_s, request_timeout_s

    def call(self, path: str, body: dict | None = None, timeout: float | None = None, what: str = "a request"):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"},
                                         method="GET" if body is None else "POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.request_timeout_s) as response:
                text = response.read()
        except urllib.error.HTTPError as err:
            detail = err.read()[:500].decode(errors="replace")
            raise ServerError(f"vLLM server at {self.url}: {what} ({path}) failed with HTTP {err.code}: "
                              f"{detail}") from err
        except (urllib.error.URLError, OSError) as err:
            raise ServerError(f"vLLM server at {self.url} did not answer {what} ({path}): {err}. If it stopped, the "
                              "run stops here; start the server again and resume from the last checkpoint "
                              "(resume=auto)") from err
        return json.loads(text) if text.strip() else None

    def wait_healthy(self, timeout_s: float, process: subprocess.Popen | None = None, log_file: str = "") -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=self.connect_timeout_s).read()
                return
            except (urllib.error.URLError, OSError) as err:
                if process is not None and process.poll() is not None:
                    raise ServerError(f"the vLLM server the trainer started for {self.url} exited with code "
                                      f"{process.returncode} before answering; its output: {log_file}") from err
                if time.monotonic() > deadline:
                    raise ServerError(f"vLLM server at {self.url} not reachable within {timeout_s:.0f} s ({err}): "
                                      "start it (VLLM_SERVER_DEV_MODE=1 vllm serve <model> "
                                      "--logprobs-mode processed_logprobs), fix rollout.engine.url, or set "
                                      "rollout.engine.launch=true") from err
                time.sleep(1.0)


class VLLMServerEngine:
    name = "vllm_server"
    external = True  # other kernels: algo/engine_correction weighs its rows
    shares_world = False  # ranks' requests are independent: no decode-step votes between ranks

    def __init__(self, url: str = "http://127.0.0.1:8000", launch: bool = False, devices: str | None = None,
                 serve_args: Sequence[str] = (), env: dict | None = None, served_model: str | None = None,
                 weight_sync: FileSync | None = None,
                 start_timeout_s: float = 600.0, connect_timeout_s: float = 10.0, request_timeout_s: float = 600.0,
                 max_concurrency: int = 64, log_file: str = "vllm_server.log") -> None:
        if max_concurrency < 1:
            raise UsageError(f"rollout.engine.max_concurrency must be >= 1, got {max_concurrency}")
        for name, value in (("start_timeout_s", start_timeout_s), ("connect_timeout_s", connect_timeout_s),
                            ("request_timeout_s", request_timeout_s)):
            if not value > 0:
                raise UsageError(f"rollout.engine.{name} must be > 0, got {value}")
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"rollout.engine.url must be an http(s) URL, got {url!r}")
        self.server = Server(url, connect_timeout_s, request_timeout_s)
        self.launch, self.devices, self.serve_args = launch, devices, [str(a) for a in serve_args]
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        self.served_model, self.start_timeout_s = served_model, start_timeout_s
        self.weight_sync = weight_sync or FileSync()
        self.max_concurrency, self.log_file = max_concurrency, log_file
        self.model: str | None = None  # the id the server serves
        self.process: subprocess.Popen | None = None
        self.synced_step: int | None = None

    @property
    def url(self) -> str:
        return self.server.url

    # -- start: the server up, serving the trainer's model and tokenizer ------------------------
    def setup(self, name_or_path: str, tokenizer, seed: int) -> None:
        if self.model is not None:
            return
        if self.launch and first_process():
            self.process = self._start(name_or_path, seed)
        self.server.wait_healthy(self.start_timeout_s if self.launch else self.server.connect_timeout_s,
                                 self.process, self.log_file)
        self.model = self.check_model(name_or_path, tokenizer)

    def _start(self, name_or_path: str, seed: int) -> subprocess.Popen:
        host_port = self.url.split("://", 1)[1]
        host, _, port = host_port.partition(":")
        args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", name_or_path,
                "--host", host, "--port", port or "8000", "--seed", str(seed),
                "--logprobs-mode", "processed_logprobs", *self.weight_sync.serve_args, *self.serve_args]
        env = dict(os.environ, **self.env, VLLM_SERVER_DEV_MODE="1")
        if self.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(self.devices)
        log.info("starting the vLLM server: %s (output: %s)", " ".join(args), self.log_file)
        Path(self.log_file).parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log_file, "ab")  # noqa: SIM115 (the server's output for its whole life)
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        atexit.register(stop_process, process)
        return process

    def close(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None

    def check_model(self, name_or_path: str, tokenizer) -> str:
        """The id the server serves: it must be the trainer's model (or `served_model`), with the
        trainer's tokenizer (the same ids for a probe text)."""
        served = self.server.call("/v1/models", what="the model list")["data"]
        ids = [m["id"] for m in served]
        roots = {m["id"]: m.get("root") or m["id"] for m in served}
        wanted = self.served_model or name_or_path
        match = [i for i in ids if same_model(i, wanted) or same_model(roots[i], wanted)]
        if not match:
            raise ServerError(f"vLLM server at {self.url} serves {ids}, not the trainer's model {wanted!r}: start it "
                              "with that model, or name what it serves in rollout.engine.served_model when it holds "
                              "the same weights under another name")
        mine = tokenizer(PROBE, add_special_tokens=False).input_ids
        theirs = self.server.call("/tokenize", {"model": match[0], "prompt": PROBE, "add_special_tokens": False},
                                  what="the tokenizer check")["tokens"]
        if list(theirs) != list(mine):
            raise ServerError(f"vLLM server at {self.url} tokenizes differently from the trainer's tokenizer "
                              f"({name_or_path}): {PROBE!r} -> {theirs[:12]}... there, {mine[:12]}... here")
        return match[0]

    # -- weights ---------------------------------------------------------------------------------
    def sync(self, policy: torch.nn.Module, step: int) -> None:
        """Push the policy's weights to the server, once per optimizer step: rank 0 sends, every
        rank gathers (FSDP2) and waits until the server holds them."""
        if step == self.synced_step:
            return
        rank, world = rank_world()
        self.weight_sync.push(self.server, policy, step, sender=rank == 0)
        if world > 1:
            torch.distributed.barrier()  # no rank samples before the server holds the new weights
        self.synced_step = step

    # -- rollouts --------------------------------------------------------------------------------
    def generate(self, policy: torch.nn.Module, tokenizer, texts: Sequence[str] | Sequence[Sequence[int]],
                 temperatures: torch.Tensor, top_p: float, max_new_tokens: int,
                 generator: torch.Generator | None = None, all_done: Callable[[bool], bool] | None = None,
                 options: SamplingOptions | None = None, limits: torch.Tensor | None = None, records=None) -> Rollout:
        """One request per row, `max_concurrency` in flight; records: unused (multi-turn rows
        arrive as token ids)."""
        k = options or SamplingOptions()
        strings = all(isinstance(t, str) for t in texts)
        prompts = tokenizer(list(texts), add_special_tokens=False).input_ids if strings else [list(t) for t in texts]
        budgets = [max_new_tokens] * len(texts) if limits is None else [min(int(x), max_new_tokens) for x in limits]
        # the same per-row seeds as the colocated engine: one draw per row from the run's stream
        seeds = ([0] * len(texts) if generator is None else
                 torch.randint(0, 2**31 - 1, (len(texts),), generator=generator, device=generator.device).tolist())
        bodies = [{"model": self.model, "prompt": p, "max_tokens": budget, "temperature": float(t),
                   "top_p": top_p if t > 0 else 1.0, "seed": s, "logprobs": 0, "return_token_ids": True,
                   "top_k": k.top_k if t > 0 else 0, "min_p": k.min_p if t > 0 else 0.0,
                   "repetition_penalty": k.repetition_penalty, "stop": list(k.stop) or None,
                   "include_stop_str_in_output": k.include_stop, "skip_special_tokens": True}
                  for p, t, s, budget in zip(prompts, temperatures.tolist(), seeds, budgets, strict=True)]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, max(1, len(bodies)))) as pool:
            answers = list(pool.map(lambda b: self.server.call("/v1/completions", b, what="a rollout request"),
                                    bodies))
        done = [a["choices"][0] for a in answers]
        tokens = [list(d["token_ids"]) for d in done]
        logprobs = [list(d["logprobs"]["token_logprobs"]) for d in done]
        device = next(policy.parameters()).device
        return rollout_from_ids(prompts, tokens, logprobs, temperatures, [d["text"] for d in done],
                                [d["finish_reason"] == "stop" for d in done], tokenizer.pad_token_id, device)


def same_model(served: str, wanted: str) -> bool:
    """A served model id or path against the trainer's name or path (local paths resolved)."""
    if served == wanted:
        return True
    a, b = Path(served), Path(wanted)
    return a.exists() and b.exists() and a.resolve() == b.resolve()


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
