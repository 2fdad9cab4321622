"""`python train.py mode=preflight`: roll out a few batches without training and check the samples.

The three pre-run checks of the sample-augmentation recipe, each with the numbers behind it:
  1. group reward std is informative: median within-group std >= min_median_std and the share
     of zero-std groups <= max_zero_std_frac;
  2. the length distribution is healthy: truncation rate <= max_truncation and p90/p10 of the
     lengths <= max_polarisation;
  3. the reward discriminates quality: each prompt's reference solution is scored against three
     corruptions of it (wrong final number, steps out of order, cut off before the answer); the
     AUC is the share of (reference, corruption) pairs where the reference scores higher, ties
     counting half, and must be >= min_auc. Steps out of order keep the right answer: they count
     only with judge_steps (a reward that claims to score the reasoning); otherwise their AUC is
     shown and not judged, since an answer-only reward ties them by design.
Writes preflight.png (reward and length distributions) into the run directory; the exit status
is non-zero when a check fails.
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import lightning as L
import torch
from omegaconf import DictConfig

from grpo_aug.algo.group_stats import group_stats, length_quantiles, polarisation
from grpo_aug.data.records import Prompt
from grpo_aug.errors import UsageError
from grpo_aug.prompts.datamodule import BucketedRecords

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreflightSettings:
    batches: int = 4
    min_median_std: float = 0.3
    max_zero_std_frac: float = 0.5
    max_truncation: float = 0.2
    max_polarisation: float = 8.0
    min_auc: float = 0.9
    judge_steps: bool = False  # "steps out of order" counts toward the AUC (a process reward)

    def __post_init__(self) -> None:
        if self.batches < 1:
            raise UsageError(f"preflight.batches must be >= 1, got {self.batches}")
        for key in ("max_zero_std_frac", "max_truncation", "min_auc"):
            if not 0 <= getattr(self, key) <= 1:
                raise UsageError(f"preflight.{key} must be in [0, 1], got {getattr(self, key)}")


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    numbers: str


# -- corruptions of a reference solution -------------------------------------------------------
def wrong_final(solution: str) -> str | None:
    head, sep, tail = solution.rpartition("####")
    match = re.search(r"-?\d[\d,]*(?:\.\d+)?", tail)
    if not sep or match is None:
        return None
    value = match.group(0).replace(",", "")
    wrong = str(int(value) + 1) if re.fullmatch(r"-?\d+", value) else f"{float(value) + 1:g}"
    return head + sep + tail[: match.start()] + wrong + tail[match.end() :]


def shuffled_steps(solution: str, rng: random.Random) -> str | None:
    """The step lines in another order (the final '####' line stays last); None for one step."""
    body, sep, final = solution.rpartition("####")
    lines = [line for line in body.strip().split("\n") if line.strip()]
    if not sep or len(lines) < 2:
        return None
    order = list(range(len(lines)))
    while order == sorted(order):
        rng.shuffle(order)
    return "\n".join(lines[i] for i in order) + "\n" + sep + final


def cut_before_answer(solution: str, answer: str) -> str | None:
    """The solution cut just before the final answer first appears: it never gets there."""
    at = solution.find(answer)
    return solution[:at] if at > 0 else None


STEP_ORDER = "steps out of order"


def pair_auc(ref: float, corrupted: list[float]) -> list[float]:
    return [1.0 if ref > c else 0.5 if ref == c else 0.0 for c in corrupted]


def discrimination(reward, prompts: list[Prompt], seed: int, tokenizer=None, judge_steps: bool = True
                   ) -> dict[str, float]:
    """AUC per corruption kind, and over the judged kinds' pairs ("all"; steps out of order only
    with judge_steps), scoring with the run's own reward (the tokenizer gives batched reward
    functions their completions' token ids)."""
    rng = random.Random(f"{seed}-preflight")
    pairs: dict[str, list[float]] = {"wrong final number": [], STEP_ORDER: [], "cut before the answer": []}
    for p in prompts:
        variants = {"wrong final number": wrong_final(p.solution),
                    STEP_ORDER: shuffled_steps(p.solution, rng),
                    "cut before the answer": cut_before_answer(p.solution, p.answer)}
        kinds = [k for k, v in variants.items() if v is not None]
        texts = [p.solution] + [variants[k] for k in kinds]
        ids = tokenizer(texts, add_special_tokens=False).input_ids if tokenizer is not None else None
        scores = reward.score([p], [texts], ids)
        if not bool(scores.scored[0, 0]):
            continue
        total = scores.total[0].tolist()
        for k, s in zip(kinds, total[1:], strict=True):
            pairs[k] += pair_auc(total[0], [s])
    aucs = {k: sum(v) / len(v) for k, v in pairs.items() if v}
    every = [x for k, v in pairs.items() if judge_steps or k != STEP_ORDER for x in v]
    aucs["all"] = sum(every) / len(every) if every else float("nan")
    return aucs


# -- the run ---------------------------------------------------------------------------------
def sample_batches(module, datamodule, batches: int):
    """Roll out the first `batches` training batches of the curriculum, as step 0.. would: the
    prompts the selector picks (and refills, if configured), not the raw batches."""
    sampler = datamodule.make_sampler(start_step=0, rank=0, world_size=1)
    records = BucketedRecords(datamodule.train_records)
    rewards, counted, lengths, truncated, prompts, calls, failures, tool_tokens = [], [], [], [], [], [], [], []
    with torch.no_grad():
        for step in range(batches):
            batch = [records[key] for key in sampler.draw(step)]
            # the prompts the feed picks, as training would; the feed's curriculum learns from them
            _, sampled, _ = module.sample_groups(batch, step, step)
            rewards.append(sampled.rewards.cpu())  # [B, G]
            counted.append(sampled.valid.cpu())  # [B, G] the rows that count in their group
            present = sampled.rows_present.reshape(-1).cpu()  # [B*G] slots a per-prompt budget filled
            ro = sampled.rollout
            lengths.append(ro.written.sum(dim=1).float().cpu()[present])  # the policy's tokens
            truncated.append(ro.truncated.cpu()[present])
            prompts += sampled.prompts
            if ro.tool_calls is not None:
                calls.append(ro.tool_calls.cpu()[present])
                failures.append(ro.tool_failures.cpu()[present])
                tool_tokens.append(ro.given.sum(dim=1).cpu()[present])
    tools = (torch.cat(calls), torch.cat(failures), torch.cat(tool_tokens)) if calls else None
    return Samples(torch.cat(rewards), torch.cat(counted), torch.cat(lengths), torch.cat(truncated), prompts, tools)


class Samples(NamedTuple):
    rewards: torch.Tensor  # [N, G]
    counted: torch.Tensor  # [N, G] bool, rows that count in their group's statistics
    lengths: torch.Tensor  # [R] the rows that exist (N*G without a per-prompt budget)
    truncated: torch.Tensor  # [R]
    prompts: list[Prompt]
    tools: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # [R] calls, failed calls, tool tokens


def tool_use(samples: Samples, described: str) -> str:
    """What the rows did with the tools (rollout/tools): shown, not judged."""
    calls, failures, tokens = samples.tools
    total = int(calls.sum())
    return (f"tool use ({described}): {float((calls > 0).float().mean()):.2f} of rows call, "
            f"{float(calls.float().mean()):.2f} calls per row, {int(failures.sum())} of {total} calls failed, "
            f"{int(tokens.sum())} tool tokens (no loss)")


def run_checks(samples: Samples, aucs, s: PreflightSettings) -> list[Check]:
    stats = group_stats(samples.rewards, samples.counted)
    stds = stats.std[stats.has_std]  # [n] groups with a std, as the advantages see them
    median_std = stds.median().item() if stds.numel() else 0.0
    zero = (~stats.informative[stats.has_std]).float().mean().item() if stds.numel() else 1.0
    trunc = samples.truncated.float().mean().item()
    p10, _, p90 = length_quantiles(samples.lengths)
    polar = polarisation(p10, p90)
    per_kind = ", ".join(f"{k} {v:.2f}" + (" (not judged)" if k == STEP_ORDER and not s.judge_steps else "")
                         for k, v in aucs.items() if k != "all")
    return [
        Check("group reward std is informative", median_std >= s.min_median_std and zero <= s.max_zero_std_frac,
              f"median within-group std {median_std:.3f} (>= {s.min_median_std:g}); zero-std groups {zero:.2f} "
              f"(<= {s.max_zero_std_frac:g})"),
        Check("length distribution is healthy", trunc <= s.max_truncation and polar <= s.max_polarisation,
              f"truncated {trunc:.2f} (<= {s.max_truncation:g}); length p10 {p10:.0f}, p90 {p90:.0f}, "
              f"p90/p10 {polar:.1f} (<= {s.max_polarisation:g})"),
        Check("reward discriminates quality", aucs["all"] >= s.min_auc,
              f"AUC {aucs['all']:.3f} (>= {s.min_auc:g}) reference vs corrupted: {per_kind}"),
    ]


def bucket_breakdown(samples: Samples) -> str:
    """Per bucket: groups with a std, and the zero-std share among them. A bucket the curriculum
    only probes (all flat, always wrong or always right) shows here, apart from the ones it trains on."""
    stats = group_stats(samples.rewards, samples.counted)
    parts = []
    for bucket in sorted({p.bucket for p in samples.prompts}):
        mine = torch.tensor([p.bucket == bucket for p in samples.prompts]) & stats.has_std  # [N]
        n = int(mine.sum())
        if n:
            flat = (~stats.informative[mine]).float().mean().item()
            parts.append(f"{bucket} {flat:.2f} of {n} groups, mean reward {stats.mean[mine].mean().item():.2f}")
    return "zero-std share by bucket: " + "; ".join(parts)


def table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = [f"{'#':<2} {'check':<{width}}  result  numbers"]
    lines += [f"{i:<2} {c.name:<{width}}  {'PASS' if c.passed else 'FAIL':<6}  {c.numbers}"
              for i, c in enumerate(checks, start=1)]
    return "\n".join(lines)


def plot(samples: Samples, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 3.6))
    stats = group_stats(samples.rewards, samples.counted)
    a.hist(samples.rewards[samples.counted].numpy(), bins=20, color="#4472c4")
    a.set(title="rewards (counted rows)", xlabel="reward", ylabel="rows")
    b.hist(stats.std[stats.has_std].numpy(), bins=20, color="#ed7d31")
    b.set(title="within-group reward std", xlabel="std", ylabel="groups")
    c.hist(samples.lengths.numpy(), bins=20, color="#70ad47")
    c.set(title="completion lengths", xlabel="tokens", ylabel="rows")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def preflight(cfg: DictConfig) -> int:
    """Run the checks for this config; print the table; 0 when every check passes, else 1."""
    from hydra.utils import instantiate

    from grpo_aug.pipeline import build_parts

    settings = instantiate(cfg.preflight)
    L.seed_everything(cfg.seed, workers=True)  # the same samples every time for the same config
    module, datamodule, _ = build_parts(cfg)
    module.configure_model()
    samples = sample_batches(module, datamodule, settings.batches)
    aucs = discrimination(module.rollout.reward, samples.prompts, cfg.seed, module.tokenizer, settings.judge_steps)
    checks = run_checks(samples, aucs, settings)
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    png = plot(samples, out / "preflight.png")
    buckets = sorted({p.bucket for p in samples.prompts})
    print(f"preflight: {settings.batches} batches, {samples.rewards.shape[0]} prompts x G={samples.rewards.shape[1]} "
          f"(buckets: {', '.join(buckets)}), no training")
    print(table(checks))
    print(bucket_breakdown(samples))
    if samples.tools is not None:
        print(tool_use(samples, module.rollout.tools.describe()))
    failed = [c.name for c in checks if not c.passed]
    print(f"distributions: {png}")
    print("preflight FAILED: " + "; ".join(failed) if failed else "preflight passed")
    return 1 if failed else 0
