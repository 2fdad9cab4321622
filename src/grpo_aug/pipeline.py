"""train(cfg): validate the config, build data, model, callbacks and loggers, then fit.

    python train.py                       # composes conf/train.yaml and calls train(cfg)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import time
import warnings
from pathlib import Path

import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger
from omegaconf import DictConfig, OmegaConf

from grpo_aug.callbacks import Alerts, SampleHealth
from grpo_aug.callbacks.run_record import RunRecord
from grpo_aug.dashboard import custom_scalar_layout, plot_health
from grpo_aug.errors import UsageError
from grpo_aug.models.gguf import resolve_model_path
from grpo_aug.models.loading import checkpoint_policy, save_pretrained_dir
from grpo_aug.models.lora import save_merged
from grpo_aug.models.module import GRPOModule
from grpo_aug.models.settings import ModelSettings
from grpo_aug.models.sharding import full_state_dict
from grpo_aug.prompts.pass_rate import retier_by_pass_rate
from grpo_aug.resume import latest_checkpoint, read_checkpoint
from grpo_aug.rollout.groups import check_tools_alone
from grpo_aug.rollout.settings import RolloutSettings
from grpo_aug.summary import build_summary, summary_text, write_summary
from grpo_aug.warmup.supervised import supervised_warmup

log = logging.getLogger(__name__)


def prepare_model(model: ModelSettings, records, cache_dir: str, seed: int, tools=None) -> str:
    """The path the policy loads from: name_or_path, or the built tiny model; then the warm-up
    (tools: the rollout's, whose protocol a share of the demonstrations is written in)."""
    path, base_id = model.name_or_path, None
    if path is not None:  # a GGUF file (maybe inside a package): its cached transformers folder
        path = resolve_model_path(path, model.gguf_file, model.package, cache_dir)
    else:
        path = model.tiny(cache_dir=cache_dir, seed=seed)
        base_id = Path(path).name  # named by its build settings, the same on every machine
    if model.warmup is not None and model.warmup.steps > 0:
        path = supervised_warmup(path, records, cache_dir, model.warmup, seed, tools, base_id)
    return str(path)


def instantiate_unwrapped(node: DictConfig, **kwargs):
    """instantiate, but a config error raised inside a nested target surfaces as itself (the
    ValueError naming its key), not wrapped in Hydra's InstantiationException per level."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        while isinstance(cause, InstantiationException):
            cause = cause.__cause__
        if isinstance(cause, ValueError):
            raise cause from None
        raise


def check_run(cfg: DictConfig) -> None:
    """The run-level numbers that no settings class owns: the optimizer's lr (a partial until the
    parameters exist) and the run length."""
    lr = cfg.model.optimizer.get("lr")
    if lr is not None and not lr > 0:
        raise UsageError(f"model.optimizer.lr must be > 0, got {lr}")
    steps = cfg.trainer.get("max_steps")
    if steps is None or steps < 1:
        raise UsageError(f"trainer.max_steps must be >= 1 (it counts optimizer steps), got {steps}")


def check_scale_out(cfg: DictConfig, model: ModelSettings) -> None:
    """The strategy x engine x adapter combinations that cannot run, refused before anything loads
    (docs/scaling.md has the table of what ran)."""
    strategy = str(cfg.trainer.get("strategy"))
    fsdp2, deepspeed = "FSDP2Strategy" in strategy, "DeepSpeed" in strategy or strategy.startswith("deepspeed")
    vllm = "VLLMEngine" in str(cfg.rollout.engine.get("_target_", ""))
    if model.lora.merge_on_save and fsdp2:
        raise UsageError("model.lora.merge_on_save=true is not supported under trainer=fsdp (the merge needs the "
                         "whole model on one rank): merge the saved adapter afterwards (policy/ holds it)")
    if vllm and deepspeed:
        raise UsageError("rollout/engine=vllm under trainer=deepspeed: ZeRO-3 partitions the weights the engine is "
                         "given, and this has never run; use trainer=fsdp (FSDP2) or trainer=ddp with the engine")
    ahead = cfg.rollout.get("ahead", 0)
    if ahead and vllm:
        raise UsageError(f"rollout.ahead={ahead} samples on a second thread while the policy trains: a vLLM engine in "
                         "the trainer's process cannot; use rollout/engine=vllm_server (a vLLM server) or the hf "
                         "engine")
    if ahead and cfg.rollout.filter.get("refill"):
        raise UsageError(f"rollout.ahead={ahead} with rollout.filter.refill=true: refill rounds draw prompts by the "
                         "prompt history, which the training step updates while the rollout samples; use one of them")
    server = "VLLMServerEngine" in str(cfg.rollout.engine.get("_target_", ""))
    if ahead and (fsdp2 or deepspeed) and not server:
        raise UsageError(f"rollout.ahead={ahead} with the hf engine under sharded weights (trainer=fsdp|deepspeed): "
                         "its copy of the weights would be sharded, its forwards collectives on a second thread; use "
                         "trainer=ddp, or rollout/engine=vllm_server")
    if vllm and fsdp2 and model.lora.active:
        raise UsageError("rollout/engine=vllm with model/lora=on under trainer=fsdp: the adapter's delta would be "
                         "folded from sharded LoRA weights, which has never run; use trainer=ddp with LoRA and "
                         "vLLM, or full fine-tuning (model/lora=none) under trainer=fsdp")


def check_tools(cfg: DictConfig):
    """rollout/tools, built once to check it (functions import, limits, the combinations that
    cannot run) before any data or model is loaded."""
    tools = instantiate_unwrapped(cfg.rollout.tools)
    if not tools.active:
        return tools
    check_tools_alone(True, "NoReflection" not in str(cfg.rollout.reflect.get("_target_", "")))
    chat = "ChatPrompt" in str(cfg.data.get("prompt_format", {}).get("_target_", ""))
    if hasattr(tools, "schemas") and not chat:
        raise UsageError("rollout/tools=functions calls tools through the chat template: use data/prompt_format=chat "
                         "(a model with a chat template)")
    return tools


def settings_node(node: DictConfig) -> DictConfig:
    """The rollout group without its nodes that build objects of their own: the engine, the
    reflection and the tools."""
    return OmegaConf.masked_copy(node, [k for k in node if k not in ("engine", "reflect", "tools")])


def prompt_datamodule(cfg: DictConfig, total_steps: int | None = None, **kwargs) -> L.LightningDataModule:
    """The DataModule (`data`) with the prompt stage's curriculum and difficulty tiers (`prompts`)."""
    return instantiate(cfg.data, schedule=instantiate(cfg.prompts.curriculum),
                       difficulty=instantiate(cfg.prompts.difficulty),
                       total_steps=cfg.trainer.max_steps if total_steps is None else total_steps, **kwargs)


def rollout_settings(node: DictConfig) -> RolloutSettings:
    return instantiate_unwrapped(settings_node(node))


def build_parts(cfg: DictConfig) -> tuple[GRPOModule, L.LightningDataModule, list[L.Callback]]:
    """Module, data and callbacks, without a Trainer (preflight and evaluation need no more)."""
    # settings first: a bad value fails here, before any data or model is loaded
    check_run(cfg)
    model = instantiate(cfg.model)
    instantiate(cfg.eval)  # checked here; the module builds its own
    weights = None
    if str(model.name_or_path).endswith(".ckpt"):  # a training checkpoint: its base model, then its weights
        base, weights = checkpoint_policy(model.name_or_path)
        model = dataclasses.replace(model, name_or_path=base, warmup=None)
    check_scale_out(cfg, model)
    rollout = rollout_settings(cfg.rollout)
    instantiate_unwrapped(cfg.rollout.engine)  # checked here (a server's URL, timeouts); the module builds its own
    tools = check_tools(cfg)
    algo = instantiate(cfg.algo, _convert_="all")
    reward = instantiate(cfg.reward, _convert_="all")
    answer = instantiate(cfg.answer, _convert_="all")
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values()]
    for callback in callbacks:
        if hasattr(callback, "check_rollout"):
            callback.check_rollout(rollout)
    datamodule = prompt_datamodule(cfg, updates_per_batch=algo.updates_per_rollout,
                                   **({"ahead": rollout.ahead} if rollout.ahead else {}))
    datamodule.setup("fit")

    began = time.monotonic()
    path = prepare_model(model, datamodule.train_records, cfg.paths.cache_dir, cfg.seed, tools)
    warmup_seconds = time.monotonic() - began
    # the run-time pieces go in as objects; the rollout settings as their config (a dataclass object
    # would be turned into a config by the merge)
    module = instantiate_unwrapped(
        cfg.module, policy={"name_or_path": path},
        feed={"selection": {"history": datamodule.history, "prompt_pool": datamodule.draw_prompts, "seed": cfg.seed,
                            "answer": answer},
              "schedule": datamodule.schedule, "total_steps": datamodule.total_steps},
        rollout={"settings": settings_node(cfg.rollout), "reward": reward, "prompt_format": datamodule.prompt_format,
                 "prompt_pool": datamodule.draw_prompts})
    if weights is not None:
        module.configure_model()
        module.policy.load_state_dict(weights)
    if getattr(datamodule.source, "tiers", None) == "pass_rate":
        retier_by_pass_rate(functools.partial(module.pass_rates, max_new_tokens=rollout.max_new_tokens, seed=cfg.seed),
                            datamodule)
    for callback in callbacks:
        if isinstance(callback, RunRecord):
            callback.add_warmup(warmup_seconds)
    return module, datamodule, callbacks


def build(cfg: DictConfig) -> tuple[L.Trainer, GRPOModule, L.LightningDataModule]:
    module, datamodule, callbacks = build_parts(cfg)
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values()]
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    if trainer.is_global_zero:  # experiment trackers get the whole config from the start (TensorBoard at the end)
        params = OmegaConf.to_container(cfg, resolve=True)
        for logger in trainer.loggers:
            if not isinstance(logger, TensorBoardLogger | CSVLogger):
                logger.log_hyperparams(params)
            if isinstance(logger, TensorBoardLogger):  # CUSTOM SCALARS: the first page (dashboard.CHARTS)
                logger.experiment.add_custom_scalars(custom_scalar_layout())
    return trainer, module, datamodule


def resume_from(cfg: DictConfig) -> str | None:
    """ckpt_path as given, or with resume=auto the run directory's latest checkpoint."""
    resume = cfg.get("resume")
    if resume not in (None, "auto"):
        raise UsageError(f"resume must be null or 'auto', got {resume!r} (a file goes in ckpt_path)")
    if resume is None or cfg.get("ckpt_path") is not None:
        if cfg.get("ckpt_path") is not None:
            read_checkpoint(cfg.ckpt_path)  # a missing or cut-short file fails here, before any model loads
        return cfg.get("ckpt_path")
    directory = Path(cfg.paths.output_dir) / "checkpoints"
    latest = latest_checkpoint(directory)
    if latest is None:
        log.info("resume=auto: no checkpoint in %s; starting afresh", directory)
        return None
    log.info("resume=auto: continuing from %s", latest)
    return str(latest)


def train(cfg: DictConfig) -> dict[str, float]:
    began = time.monotonic()
    # each checkpoint holds the weights after the step's updates, which is what resuming needs;
    # Lightning warns about manual optimization regardless
    warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
    L.seed_everything(cfg.seed, workers=True)
    ckpt_path = resume_from(cfg)
    trainer, module, datamodule = build(cfg)
    try:
        return fit_and_report(cfg, trainer, module, datamodule, ckpt_path, began)
    finally:
        stop_engine(module)


def stop_engine(module: GRPOModule) -> None:
    """A vLLM server the run started stops with the run, however it ends."""
    close = getattr(module.rollout.engine, "close", None)
    if close is not None:
        close()


def fit_and_report(cfg: DictConfig, trainer: L.Trainer, module: GRPOModule, datamodule: L.LightningDataModule,
                   ckpt_path: str | None, began: float) -> dict[str, float]:
    if cfg.get("validate_before_training", True) and ckpt_path is None:
        trainer.validate(module, datamodule=datamodule, verbose=False)  # the step-0 baseline
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    # the step-interval checkpoint misses a last step that is not a multiple of its interval
    # weights_only=False: a full checkpoint (optimizer, loops, callbacks, the run's rollout and feed
    # state) that resume=auto continues from; reading it back stays weights_only=True
    trainer.save_checkpoint(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=False)
    weights = full_state_dict(module.policy)  # every rank: under FSDP2 gathering the weights is a collective
    if trainer.is_global_zero:
        out = save_pretrained_dir(module.policy, module.tokenizer, Path(cfg.paths.output_dir) / "policy", weights)
        log.info("final policy saved to %s", out)
        if module.models.lora.merge_on_save:
            merged = save_merged(module.policy, out / "merged")
            module.tokenizer.save_pretrained(merged)
            log.info("merged model (adapter folded in) saved to %s", merged)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    final = {**metrics, **module.last_eval, **final_health(trainer)}
    log_final_hparams(trainer, cfg, final)
    if trainer.is_global_zero:
        report_run(trainer, module, Path(cfg.paths.output_dir), time.monotonic() - began)
    return final


def report_run(trainer: L.Trainer, module: GRPOModule, run_dir: Path, seconds: float) -> dict:
    """The end-of-run summary: printed, <run>/summary.json, and the first page as <run>/health.png."""
    record = next((c for c in trainer.callbacks if isinstance(c, RunRecord)), RunRecord())
    alerts = next((c.counts for c in trainer.callbacks if isinstance(c, Alerts)), {})
    tensorboard = any(isinstance(logger, TensorBoardLogger) for logger in trainer.loggers)
    plot = plot_health(run_dir, run_dir / "health.png") if tensorboard else None
    times = {"total": seconds, "warmup": record.warmup_seconds, "grpo": record.train_seconds,
             "evaluation": record.eval_seconds}
    summary = build_summary(run_dir, record.evaluations, times, trainer.global_step, module.feed.flat_rows_frac(),
                            alerts, tensorboard, plot, record.phase_seconds)
    write_summary(summary)
    log.info("%s", summary_text(summary))
    return summary


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """mode=eval: the held-out evaluation of model.name_or_path (a directory or a training .ckpt),
    no training; the numbers go to the log, TensorBoard and <run dir>/eval.json."""
    L.seed_everything(cfg.seed, workers=True)
    module, datamodule, _ = build_parts(cfg)
    if cfg.eval.limit is not None:
        datamodule.heldout_records = datamodule.heldout_records[: cfg.eval.limit]
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values()]
    trainer = instantiate(cfg.trainer, callbacks=[], logger=loggers or False)
    try:
        trainer.validate(module, datamodule=datamodule, verbose=False)
    finally:
        stop_engine(module)
    counts = {b: sum(r.bucket == b for r in datamodule.heldout_records) for b in ("easy", "medium", "hard")}
    result = {"model": str(cfg.model.name_or_path), "eval_path": cfg.data.get("eval_path"),
              "samples": cfg.eval.samples, "temperature": cfg.eval.temperature, "problems": counts,
              "metrics": module.last_eval}
    if trainer.is_global_zero:
        out = Path(cfg.paths.output_dir) / "eval.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        log.info("evaluation written to %s", out)
    for logger in trainer.loggers:
        logger.finalize("success")
    return module.last_eval


def final_health(trainer: L.Trainer) -> dict[str, float]:
    health = next((c for c in trainer.callbacks if isinstance(c, SampleHealth)), None)
    return dict(health.last) if health is not None else {}


def log_final_hparams(trainer: L.Trainer, cfg: DictConfig, final: dict[str, float]) -> None:
    """The run's settings next to its final numbers in TensorBoard's HPARAMS tab (the logger
    flattens the nested config itself); the final numbers as final/* metrics in W&B and MLflow."""
    params = OmegaConf.to_container(cfg, resolve=True)
    # a metric without a value (NaN) is left out: TensorBoard's HPARAMS table would show it as a number
    metrics = {f"final/{k}": v for k, v in final.items()
               if k.startswith(("eval/", "health/", "train/reward")) and math.isfinite(v)}
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.log_hyperparams(params, metrics)
        elif not isinstance(logger, CSVLogger):  # trackers: the config went in at the start
            logger.log_metrics(metrics, step=trainer.global_step)
        logger.finalize("success")  # fit already closed the writer; this one must be flushed too
        if isinstance(logger, WandbLogger):
            logger.experiment.finish()  # the run is over: its offline files are complete now
