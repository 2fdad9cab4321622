"""Alerts: the sample-side failures that a falling loss hides, each with its likely cause.

Every step's statistics are averaged over ranks (so every rank takes the same decision) and kept
for a window of steps. An alert is checked once the window is full; after it fires it stays
silent for a window. Each firing is one console line, a TensorBoard text entry
`alerts/<name>/message`, and the running count `alerts/<name>`; names in `fail_on` stop training.

    low_std               mean within-group reward std < low_std: groups carry little signal
    high_std              mean within-group reward std > high_std: outliers dominate the groups
    kl_spike              the step's KL > kl_spike_factor x max(its median over the window, kl_floor)
    low_effective_tokens  share of the update's generated tokens that carry loss < min_effective_tokens
    length_polarisation   p90 / p10 of completion lengths > max_polarisation
    non_finite_loss       an update's loss or gradient norm was NaN/inf (the update was skipped)
    junk_tokens           share of completion characters that are junk (U+FFFD, control characters,
                          letters outside the prompt's script) > max_junk
    tool_failures         share of the window's tool calls that failed > max_tool_failures (rollout/tools)
    truncation            share of completions cut at rollout.max_new_tokens > max_truncation: the reward
                          reads answers that were never written, and the loss trains on the cut rows
    looping               share of completions that loop (a token 4-gram > 3 times) > max_looping
    heldout_below_start   at an evaluation, a bucket's held-out accuracy is more than max_heldout_drop below
                          its step-0 value: the run learns its training prompts, not the task (checked at
                          each evaluation; needs validate_before_training)
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from grpo_aug.algo.group_stats import counted_mean, group_stats, length_quantiles, mean_std, polarisation
from grpo_aug.errors import UsageError
from grpo_aug.report import StepReport

log = logging.getLogger(__name__)

ALERTS = ("low_std", "high_std", "kl_spike", "low_effective_tokens", "length_polarisation", "non_finite_loss",
          "junk_tokens", "tool_failures", "heldout_below_start", "truncation", "looping")
EVAL_PREFIX = "eval/accuracy/"


class StepStats(NamedTuple):
    reward_std: float  # mean within-group std
    reward_mean: float
    reward_min: float
    reward_max: float
    kl_mean: float
    effective_ratio: float
    polarisation: float  # p90 / p10 of lengths
    nonfinite: float  # updates skipped for a non-finite loss or gradient norm
    max_temperature: float
    loss_tokens: float = 1.0  # 0: no group entered the update (the KL and token shares are not defined)
    junk: float = 0.0  # share of completion characters that are junk
    tool_calls: float = 0.0  # tool calls this step (rollout/tools)
    tool_failures: float = 0.0  # of them, failed
    truncated: float = 0.0  # share of completions cut at max_new_tokens
    looping: float = 0.0  # share of completions that loop


def step_stats(report: StepReport) -> torch.Tensor:
    """The step's StepStats as one tensor (to be averaged over ranks in a single reduce).

    The std is `group_stats`' (the rows that count, as the advantages see them); mean, min and
    max are over scored rows only (0 when no row was scored)."""
    rewards, scored = report.rewards, report.scored  # [N, G]
    lengths = report.lengths.float()  # [R] the rows that exist
    p10, _, p90 = length_quantiles(lengths)
    seen = rewards[scored].double() if bool(scored.any()) else torch.zeros(1, dtype=torch.float64)
    # the share of the update's generated tokens that carry loss: groups left out whole (zero-std
    # filter) are not junk the masks removed, and an update without rows removed nothing
    generated = report.generated_tokens.float()
    effective = report.loss_tokens / generated if generated > 0 else torch.ones(())
    values = [mean_std(group_stats(rewards, report.counted)), counted_mean(rewards, scored), seen.min(), seen.max(),
              report.kl_mean, effective, polarisation(p10, p90), report.nonfinite, report.temperatures.max(),
              report.loss_tokens, report.junk_chars / report.completion_chars.clamp(min=1)]
    values += [0.0, 0.0] if report.tool_calls is None else [report.tool_calls.sum(), report.tool_failures.sum()]
    values += [report.truncated.float().mean() if report.truncated.numel() else 0.0,
               report.looping.float().mean() if report.looping is not None and report.looping.numel() else 0.0]
    return torch.stack([torch.as_tensor(v, dtype=torch.float32, device=rewards.device) for v in values])


class Thresholds(NamedTuple):
    low_std: float = 0.3
    high_std: float = 2.0
    kl_spike_factor: float = 5.0
    kl_floor: float = 0.01  # the running median counts as at least this: KL rises from 0 at the start
    min_effective_tokens: float = 0.5
    max_polarisation: float = 8.0
    near_greedy: float = 0.05
    max_junk: float = 0.02
    max_tool_failures: float = 0.25
    max_heldout_drop: float = 0.02
    max_truncation: float = 0.25
    max_looping: float = 0.1


def low_std_cause(window: Sequence[StepStats], t: Thresholds) -> str:
    if max(s.max_temperature for s in window) <= t.near_greedy:
        return f"sampling is near-greedy (every rollout temperature <= {t.near_greedy:g}): raise rollout.temperatures"
    low, high = min(s.reward_min for s in window), max(s.reward_max for s in window)
    if low == high:
        return f"the reward has no spread: every completion scored {low:g}; check the reward function"
    mean = statistics.fmean(s.reward_mean for s in window)
    if mean <= 0.05:
        return f"prompts are too hard for the policy (mean reward {mean:.3f}): an easier curriculum"
    if mean >= 0.95:
        return f"prompts are too easy (mean reward {mean:.3f}): a harder curriculum"
    return "the completions of a group agree: more temperature rungs, a larger group, or method hints"


def check(window: Sequence[StepStats], t: Thresholds) -> dict[str, str]:
    """Alerts that fire on this window of step statistics (oldest first, the last is this step)."""
    fired = {}
    last = window[-1]
    if last.nonfinite > 0:
        fired["non_finite_loss"] = ("a loss or gradient norm was NaN/inf; the update was skipped, weights unchanged "
                                    "(check lr, masks, reward scale)")
    std = statistics.fmean(s.reward_std for s in window)
    if std < t.low_std:
        fired["low_std"] = f"group reward std {std:.3f} < {t.low_std:g}; likely cause: {low_std_cause(window, t)}"
    if std > t.high_std:
        fired["high_std"] = (f"group reward std {std:.3f} > {t.high_std:g}: outliers dominate; enable "
                             "algo/winsorize=quantile or lower algo.adv_clip")
    earlier = [s.kl_mean for s in window[:-1] if s.loss_tokens > 0]  # steps without an update have no KL
    if earlier and last.loss_tokens > 0:
        median = statistics.median(earlier)
        # against at least the floor: KL climbing from ~0 as training starts is not a spike
        if last.kl_mean > t.kl_spike_factor * max(median, t.kl_floor):
            fired["kl_spike"] = (f"KL {last.kl_mean:.4f} is over {t.kl_spike_factor:g}x its running median "
                                 f"{median:.4f}: lower the lr or raise the KL weight (algo/beta)")
    effective = statistics.fmean(s.effective_ratio for s in window)
    if effective < t.min_effective_tokens:
        fired["low_effective_tokens"] = (f"only {effective:.2f} of generated tokens carry loss: check dedup, "
                                         "truncation and the algo masks")
    polar = statistics.fmean(s.polarisation for s in window)
    if polar > t.max_polarisation:
        fired["length_polarisation"] = (f"completion lengths are polarised (p90/p10 = {polar:.1f}): some stop at "
                                        "once, others run to the limit; look at the text samples")
    junk = statistics.fmean(s.junk for s in window)
    if junk > t.max_junk:
        fired["junk_tokens"] = (f"{junk:.1%} of completion characters are junk (U+FFFD, control characters, letters "
                                "outside the prompt's script); likely cause: a tokenizer that does not match the model "
                                "or decodes byte pieces apart, a wrong chat template, or temperatures so high that "
                                "sampling leaves the language; look at the text samples")
    calls = sum(s.tool_calls for s in window)
    failed = sum(s.tool_failures for s in window) / calls if calls > 0 else 0.0
    if failed > t.max_tool_failures:
        fired["tool_failures"] = (f"{failed:.1%} of tool calls failed (raised, timed out or were refused) > "
                                  f"{t.max_tool_failures:g}; the errors are in the transcripts: look at the text "
                                  "samples, check the tool on such arguments, or raise "
                                  "rollout.tools.limits.time_limit_s")
    cut = statistics.fmean(s.truncated for s in window)
    if cut > t.max_truncation:
        fired["truncation"] = (f"{cut:.1%} of completions were cut at rollout.max_new_tokens > {t.max_truncation:g}: "
                               "their answers were never written; raise rollout.max_new_tokens, ask for shorter "
                               "answers (system prompt), or algo.mask_truncated=true / reward.overlong_buffer")
    looped = statistics.fmean(s.looping for s in window)
    if looped > t.max_looping:
        fired["looping"] = (f"{looped:.1%} of completions repeat a token 4-gram more than 3 times > {t.max_looping:g}: "
                            "degenerate loops; lower the temperatures, rollout.repetition_penalty > 1, or "
                            "algo.repeat_ngram to take the loops out of the loss")
    return fired


def heldout_drops(start: dict[str, float], now: dict[str, float], t: Thresholds) -> dict[str, tuple[float, float]]:
    """Buckets whose held-out accuracy fell more than max_heldout_drop below its start: (start, now)."""
    return {k[len(EVAL_PREFIX):]: (start[k], v) for k, v in now.items()
            if k.startswith(EVAL_PREFIX) and k in start and start[k] - v > t.max_heldout_drop}


class AlertFailure(UsageError, RuntimeError):
    pass


class Alerts(L.Callback):
    def __init__(self, window: int = 10, fail_on: Sequence[str] = (), **thresholds) -> None:
        if window < 2:
            raise UsageError(f"callbacks.alerts.window must be >= 2, got {window}")
        unknown = [n for n in fail_on if n not in ALERTS]
        if unknown:
            raise UsageError(f"callbacks.alerts.fail_on has unknown alert(s) {unknown}; known: {list(ALERTS)}")
        bad = [k for k in thresholds if k not in Thresholds._fields]
        if bad:
            raise UsageError(f"callbacks.alerts has unknown key(s) {bad}; thresholds are {list(Thresholds._fields)}")
        self.thresholds = Thresholds(**thresholds)
        for key, value in self.thresholds._asdict().items():
            if not value >= 0:
                raise UsageError(f"callbacks.alerts.{key} must be >= 0, got {value}")
        t = self.thresholds
        if t.low_std >= t.high_std:
            raise UsageError(f"callbacks.alerts needs low_std < high_std, got low_std={t.low_std}, "
                             f"high_std={t.high_std}")
        self.window = window
        self.fail_on = set(fail_on)
        self.history: deque[StepStats] = deque(maxlen=window)
        self.counts = dict.fromkeys(ALERTS, 0)
        self.quiet_until = dict.fromkeys(ALERTS, 0)  # history length index: no repeat within a window
        self.seen = 0
        self.start: dict[str, float] | None = None  # the step-0 held-out accuracies

    def on_validation_end(self, trainer, pl_module) -> None:
        accuracy = {k: float(v) for k, v in getattr(pl_module, "last_eval", {}).items() if k.startswith(EVAL_PREFIX)}
        if not accuracy:
            return
        if self.start is None:
            if trainer.global_step == 0:
                self.start = accuracy
            return
        drops = heldout_drops(self.start, accuracy, self.thresholds)
        if not drops:
            return
        recent = statistics.fmean(s.reward_mean for s in self.history) if self.history else float("nan")
        where = ", ".join(f"{b} {now:.3f} (start {was:.3f})" for b, (was, now) in drops.items())
        self._fire(trainer, "heldout_below_start",
                   f"held-out accuracy fell more than {self.thresholds.max_heldout_drop:g} below its start: {where}, "
                   f"while the train reward is {recent:.2f}; likely cause: the run learns its training prompts, not "
                   "the task: look at prompts/attempts_mean (rollouts per distinct prompt) and try "
                   "prompts/selector=none, or a lower lr")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        report: StepReport = outputs["report"]
        stats = trainer.strategy.reduce(step_stats(report), reduce_op="mean")
        self.history.append(StepStats(*stats.tolist()))
        self.seen += 1
        full = len(self.history) == self.window
        fired = check(list(self.history), self.thresholds) if full else {}
        if not full and self.history[-1].nonfinite > 0:  # this one cannot wait for a full window
            fired = {"non_finite_loss": check([self.history[-1]], self.thresholds)["non_finite_loss"]}
        for name, message in fired.items():
            if self.seen < self.quiet_until[name]:
                continue
            self.quiet_until[name] = self.seen + self.window
            self._fire(trainer, name, message)

    def _fire(self, trainer, name: str, message: str) -> None:
        self.counts[name] += 1
        self._report(trainer, name, message)
        if name in self.fail_on:
            raise AlertFailure(f"stopping at step {trainer.global_step}: alert {name}: {message} "
                               f"(callbacks.alerts.fail_on contains {name!r})")

    def _report(self, trainer, name: str, message: str) -> None:
        line = f"ALERT {name} at step {trainer.global_step}: {message}"
        if trainer.is_global_zero:
            log.warning(line)
        for logger in trainer.loggers:
            logger.log_metrics({f"alerts/{name}": float(self.counts[name])}, step=trainer.global_step)
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_text(f"alerts/{name}/message", line, trainer.global_step)

    def state_dict(self) -> dict:
        return {"history": [list(s) for s in self.history], "counts": self.counts, "quiet_until": self.quiet_until,
                "seen": self.seen, "start": self.start}

    def load_state_dict(self, state: dict) -> None:
        self.history = deque((StepStats(*s) for s in state["history"]), maxlen=self.window)
        self.counts.update(state["counts"])
        self.quiet_until.update(state["quiet_until"])
        self.start = state.get("start")  # checkpoints from before the held-out alert have none
        self.seen = state["seen"]
