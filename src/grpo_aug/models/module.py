"""The GRPO LightningModule: rollout, reward, group advantage and clipped loss in training_step."""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

import lightning as L
import torch
from torchmetrics.aggregation import SumMetric

from grpo_aug.algo import group_advantages, policy_loss, token_logprobs
from grpo_aug.algo.group_stats import counted_mean
from grpo_aug.algo.masks import overlong_penalty, repetition_mask, template_mask, truncation_mask
from grpo_aug.algo.settings import AlgoSettings
from grpo_aug.data.records import BUCKETS, Prompt
from grpo_aug.lean.forward import packable
from grpo_aug.models.loading import frozen_copy, load_policy, load_tokenizer
from grpo_aug.resume import capture_rng, gather_per_rank, own_entry, restore_rng
from grpo_aug.rewards import MathReward, RewardSet
from grpo_aug.rollout import Rollout, generate
from grpo_aug.rollout.filter import informative_groups
from grpo_aug.rollout.merge import chunk_saving, concat_rollouts, length_chunks, select_rows, trim
from grpo_aug.rollout.settings import RolloutSettings

log = logging.getLogger(__name__)


class SampledGroups(NamedTuple):
    prompts: list[Prompt]
    rollout: Rollout  # [n*G] rows
    rewards: torch.Tensor  # [n, G] total reward, overlong shaping included; 0 where unscorable
    parts: dict[str, torch.Tensor]  # per reward function, [n, G], NaN where unscorable
    errors: dict[str, int]  # per reward function, calls that raised (reward.on_error=skip)
    timeouts: dict[str, int]  # per reward function, calls past reward.timeout_s
    distinct: torch.Tensor  # [n, G]
    scored: torch.Tensor  # [n, G] every reward function returned a number
    valid: torch.Tensor  # [n, G] scored, passed every reward filter, not a near-copy, group kept
    informative: torch.Tensor  # [n] groups whose counted rewards differ


def merge_rounds(rounds: list[SampledGroups], pad_id: int) -> SampledGroups:
    if len(rounds) == 1:
        return rounds[0]
    return SampledGroups(
        prompts=[p for r in rounds for p in r.prompts],
        rollout=concat_rollouts([r.rollout for r in rounds], pad_id),
        rewards=torch.cat([r.rewards for r in rounds]),
        parts={k: torch.cat([r.parts[k] for r in rounds]) for k in rounds[0].parts},
        errors={k: sum(r.errors[k] for r in rounds) for k in rounds[0].errors},
        timeouts={k: sum(r.timeouts[k] for r in rounds) for k in rounds[0].timeouts},
        distinct=torch.cat([r.distinct for r in rounds]),
        scored=torch.cat([r.scored for r in rounds]),
        valid=torch.cat([r.valid for r in rounds]),
        informative=torch.cat([r.informative for r in rounds]),
    )


# Share of the scored block that length-sorted chunks must save before rows are split into them:
# below it, the extra forward calls cost more than the padding they avoid.
CHUNK_WHEN_SAVING_ABOVE = 0.3

STAT_MAX = ("kl_max", "ratio_max")


def merge_stats(parts: list[dict[str, torch.Tensor]], device) -> dict[str, torch.Tensor]:
    """Chunk stats -> update stats: means weighted by the tokens of the chunks that report the
    stat (entropy is measured on some updates only), maxima for the *_max entries."""
    names = ("kl_mean", "kl_max", "clip_frac", "clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_max", "entropy")
    merged = {}
    for name in names:
        reporting = [p for p in parts if name in p]
        if not reporting:
            merged[name] = torch.zeros((), device=device)
        elif name in STAT_MAX:
            merged[name] = torch.stack([p[name] for p in reporting]).max()
        else:
            tokens = torch.stack([p["tokens"] for p in reporting]).float()
            values = torch.stack([p[name] for p in reporting])
            merged[name] = (values * tokens).sum() / tokens.sum().clamp(min=1)
    return merged


def gradient_norm(model: torch.nn.Module) -> torch.Tensor:
    """L2 norm of this rank's gradients (its shard under FSDP/ZeRO); inf or NaN if any entry is."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))


class PreparedStep(NamedTuple):
    sampled: SampledGroups  # everything that was rolled out this step
    rollout: Rollout  # [B*G] rows of the groups that enter the update
    mask: torch.Tensor  # [B*G, T] tokens that carry loss
    advantages: torch.Tensor  # [B*G]
    ref_logps: torch.Tensor | None  # [B*G, T]; None when no group entered the update
    old_logps: torch.Tensor | None  # [B*G, T] rollout policy; None when it is the policy itself (mu = 1)
    outputs: dict[str, torch.Tensor]  # plain tensors for the callbacks


class NonFiniteTraining(RuntimeError):
    """Too many updates in a row were non-finite: the run stops instead of spinning."""


class GRPOModule(L.LightningModule):
    def __init__(
        self,
        name_or_path: str,
        optimizer: Callable[..., torch.optim.Optimizer],
        reward: RewardSet,
        rollout: RolloutSettings,
        algo: AlgoSettings,
        dtype: str = "float32",
        eval_max_new_tokens: int | None = None,
        lr_warmup_steps: int = 0,
        prompt_pool: Callable[[str, int, int, int, set[str]], list[Prompt]] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer", "reward", "rollout", "algo", "prompt_pool"])
        # several optimizer steps per rollout (algo.num_iterations x algo.minibatches)
        self.automatic_optimization = False
        self.name_or_path = str(name_or_path)
        self.optimizer_factory = optimizer
        self.reward = reward
        self.rollout_settings = rollout
        self.algo = algo
        self.dtype_name = dtype
        self.eval_max_new_tokens = eval_max_new_tokens or rollout.max_new_tokens
        self.lr_warmup_steps = lr_warmup_steps
        if rollout.filter.refill and prompt_pool is None:
            raise ValueError("rollout.filter.refill needs a prompt pool (the DataModule's draw_prompts)")
        self.prompt_pool = prompt_pool  # (bucket, n, step, round, used ids) -> fresh prompts
        self.tokenizer = load_tokenizer(self.name_or_path)  # fails now if the path is wrong
        self.seed = seed
        # the rollout's own random stream: checkpointed, and untouched by anything else that draws
        # (dataloader workers, evaluation), so a resumed run samples what an uninterrupted one does
        self._generator: torch.Generator | None = None
        self._restored: dict | None = None  # run state from a checkpoint, applied when training starts
        self.policy: torch.nn.Module | None = None
        # a list hides the reference from nn.Module registration: it is not trained, not in the
        # optimizer and not in checkpoints (it is reloaded from name_or_path on resume)
        self._frozen: list[torch.nn.Module] = []
        self._pieces: dict[int, str] = {}  # token id -> its text alone, for the template masks
        self.reward_errors: Counter[str] = Counter()  # calls that raised, per reward function, this run
        self.reward_timeouts: Counter[str] = Counter()  # calls past reward.timeout_s, this run
        self.skipped_total = 0  # updates skipped for a non-finite loss or gradient norm, this run
        self.consecutive_skipped = 0
        self.logged_window = 0  # global_step // trainer.log_every_n_steps at the last train/* write
        self.exact = MathReward()
        self.last_eval: dict[str, float] = {}
        self.val_correct = torch.nn.ModuleDict({b: SumMetric() for b in BUCKETS})
        self.val_total = torch.nn.ModuleDict({b: SumMetric() for b in BUCKETS})

    @property
    def reference(self) -> torch.nn.Module:
        return self._frozen[0]

    def configure_model(self) -> None:
        if self.policy is not None:  # Lightning may call this more than once
            return
        self.policy = load_policy(self.name_or_path, self.dtype_name)
        self.policy.train()  # from_pretrained returns eval mode; training wants dropout as configured
        self._frozen = [frozen_copy(self.policy)]

    def configure_optimizers(self) -> dict:
        optimizer = self.optimizer_factory(params=self.policy.parameters())
        # a linear lr ramp: Adam's first updates move every weight by ~lr whatever the gradient,
        # and early policy-gradient estimates are mostly noise
        ramp = max(self.lr_warmup_steps, 0) + 1
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / ramp))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def transfer_batch_to_device(self, batch: list[Prompt], device, dataloader_idx: int) -> list[Prompt]:
        return batch  # prompt records are text; the rollout tokenises them on the model's device

    def on_fit_start(self) -> None:
        self.reference.to(self.device)

    @property
    def generator(self) -> torch.Generator:
        if self._generator is None:
            device = next(self.policy.parameters()).device
            rank = self.global_rank if self._trainer is not None else 0
            self._generator = torch.Generator(device=device).manual_seed(self.seed * 100_003 + rank)
        return self._generator

    def on_train_start(self) -> None:
        self.logged_window = self.global_step // self.trainer.log_every_n_steps
        if self._restored is not None:  # late: Lightning draws from the global stream while setting up
            rng = own_entry(self._restored["rng"], "random streams")
            if rng is not None:
                restore_rng(rng, self.generator)
            self._restored = None

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["beta_schedule"] = self.algo.beta.state_dict()
        checkpoint["run_state"] = {
            "rng": gather_per_rank(capture_rng(self.generator)),  # every rank calls this: it gathers
            "reward_errors": dict(self.reward_errors),
            "reward_timeouts": dict(self.reward_timeouts),
            "skipped_total": self.skipped_total,
            "consecutive_skipped": self.consecutive_skipped,
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.algo.beta.load_state_dict(checkpoint.get("beta_schedule", {}))
        state = checkpoint.get("run_state")
        if state is not None:
            self.reward_errors = Counter(state["reward_errors"])
            self.reward_timeouts = Counter(state["reward_timeouts"])
            self.skipped_total = state["skipped_total"]
            self.consecutive_skipped = state["consecutive_skipped"]
            self._restored = state

    # -- one GRPO step: a rollout, then algo.num_iterations x algo.minibatches updates ----------
    def training_step(self, batch: list[Prompt], batch_idx: int) -> dict[str, torch.Tensor]:
        a = self.algo
        # 1-5. rollout, filters, masks, advantages, reference (and old) log-probs
        step = self.prepare(batch)

        # 6. the clipped-loss updates over minibatches of whole groups
        beta = a.beta(self.global_step)
        parts = torch.tensor_split(torch.arange(step.advantages.numel() // self.rollout_settings.group_size),
                                   a.minibatches)
        stats = [self._update(step, beta, part, entropy=(i == 0 and j == 0))
                 for i in range(a.num_iterations) for j, part in enumerate(parts)]

        # 7. logs, the beta schedule's view of the KL, plain tensors for the callbacks
        updates = {k: torch.stack([st[k] for st in stats]) for k in stats[0]}  # [U] each
        kl_mean = self.trainer.strategy.reduce(updates["kl_mean"][: a.minibatches].mean(), reduce_op="mean")
        a.beta.observe(self.global_step, kl_mean.item())
        self.skipped_total += int(updates["skipped"].sum())
        self._log_step(step, updates, beta)
        if self.consecutive_skipped >= a.max_consecutive_nonfinite:
            raise NonFiniteTraining(
                f"step {self.global_step}: {self.consecutive_skipped} updates in a row had a non-finite loss or "
                f"gradient norm and were skipped (algo.max_consecutive_nonfinite={a.max_consecutive_nonfinite}); "
                f"the weights are those of the last finite update. {self._last_checkpoint_hint()} "
                "Lower the lr, check the reward scale and the masks, or resume from an earlier checkpoint.")
        return {
            **step.outputs,
            "kl_mean": kl_mean,
            "kl_max": updates["kl_max"].max(),
            "entropy_mean": updates["entropy"][0],
            "clip_frac": updates["clip_frac"].mean(),
            "clip_frac_low": updates["clip_frac_low"].mean(),
            "clip_frac_high": updates["clip_frac_high"].mean(),
            "nonfinite": updates["skipped"].sum(),  # updates skipped on every rank this step
            "updates": updates,
        }

    def prepare(self, batch: list[Prompt]) -> PreparedStep:
        """Everything an update needs, computed once per rollout; no optimizer involved."""
        s, G, a = self.rollout_settings, self.rollout_settings.group_size, self.algo

        # 1. sample: one batched rollout of B x G rows, rewards, near-copy marks
        rounds = [self.sample_round(batch)]

        # 2. optionally leave out groups with no reward spread, refilling from the same bucket
        informative = rounds[0].informative  # [B]
        while s.filter.refill and int(informative.sum()) < len(batch) and len(rounds) <= s.filter.max_rounds:
            used = {p.id for r in rounds for p in r.prompts}
            extra = self.prompt_pool(batch[0].bucket, len(batch) - int(informative.sum()), self.global_step,
                                     len(rounds), used)
            if not extra:
                break
            rounds.append(self.sample_round(extra))
            informative = torch.cat([r.informative for r in rounds])
        sampled = merge_rounds(rounds, self.tokenizer.pad_token_id)
        keep = sampled.informative if s.filter.zero_std else torch.ones_like(sampled.informative)  # [N]
        valid = sampled.valid & keep[:, None]  # [N, G]
        groups = keep.nonzero().squeeze(1)  # the groups that enter the update
        B = len(groups)
        rows = (groups[:, None] * G + torch.arange(G, device=groups.device)).reshape(-1)  # [B*G]
        ro = sampled.rollout if B == len(keep) else select_rows(sampled.rollout, rows)

        # 3. which tokens carry loss: padding, truncation, scaffolding, repeats, left-out rows
        mask = self._loss_mask(ro, valid[groups])  # [B*G, T]

        # 4. advantages from the step's (optionally winsorised) rewards, within each group
        rewards = self.reward.winsorize(sampled.rewards[groups], valid[groups])  # [B, G]
        advantages = group_advantages(rewards, valid[groups], adv_clip=a.adv_clip,
                                      scale_by_std=a.scale_by_std).reshape(-1)  # [B*G]

        # 5. reference log-probs, and the rollout policy's when it changes before the last update
        chunks = self._chunks(ro.completion_mask.sum(dim=1), ro.prompt_len)
        with torch.no_grad():
            ref_logps = self._chunked_logprobs(self.reference, ro, chunks) if B > 0 else None  # [B*G, T]
            old_logps = self._chunked_logprobs(self.policy, ro, chunks) if B > 0 and a.updates_per_rollout > 1 else None

        outputs = {
            "rewards": sampled.rewards,  # [N, G] all sampled groups, refills included
            "distinct": sampled.distinct,  # [N, G] not a near-copy of an earlier row
            "scored": sampled.scored,  # [N, G] every reward function returned a number
            "counted": sampled.valid,  # [N, G] count in their group's statistics (before the zero-std filter)
            "valid": valid,  # [N, G] counted in the loss: counted rows of the groups in the update
            "temperatures": sampled.rollout.temperatures,  # [N*G] each row's sampling temperature
            "lengths": sampled.rollout.completion_mask.sum(dim=1),  # [N*G] generated tokens, EOS included
            "loss_tokens": mask.sum(),  # tokens that carry loss after every mask
            "generated_tokens": ro.completion_mask.sum(),  # of the rows that entered the update
            "truncated": sampled.rollout.truncated,  # [N*G] no EOS within max_new_tokens
            "advantages": advantages[valid[groups].reshape(-1)],  # [n] of the rows counted in the update
            "samples": self._samples(sampled, groups, advantages),
            "refill_rounds": torch.tensor(float(len(rounds) - 1), device=self.device),
            "refill_exhausted": torch.tensor(float(s.filter.refill and int(informative.sum()) < len(batch)),
                                             device=self.device),
        }
        return PreparedStep(sampled, ro, mask, advantages, ref_logps, old_logps, outputs)

    def _update(self, step: PreparedStep, beta: float, groups: torch.Tensor, entropy: bool) -> dict[str, torch.Tensor]:
        """One optimizer step on `groups` (indices into the step's groups); returns detached stats.

        The rows may run in length-sorted chunks, each with its own backward; their losses are
        parts of the whole update's loss, so the accumulated gradient is the unchunked one.
        A non-finite chunk loss, or a non-finite gradient norm, on any rank skips the whole
        update on every rank: the gradients are dropped and neither the optimizer nor the lr
        schedule steps, so weights and optimizer state stay bit-identical (AdamW's moments would
        otherwise move every weight even on a zero gradient). The step still counts toward
        trainer.max_steps; `train/skipped_nonfinite` counts it. An update without a single loss
        token on any rank (every group filtered out as flat) is skipped the same way, uncounted:
        a zero gradient would still move every weight through AdamW's momentum.
        """
        a, G, ro = self.algo, self.rollout_settings.group_size, step.rollout
        optimizer, schedule = self.optimizers(), self.lr_schedulers()
        optimizer.zero_grad()
        rows = (groups[:, None] * G + torch.arange(G)).reshape(-1).to(ro.input_ids.device)  # [b*G]
        total_tokens = step.mask[rows].sum()
        aggregate = functools.partial(a.loss.part, rows=len(rows), tokens=total_tokens)
        parts, nonfinite = [], 0
        for chunk in self._chunks(ro.completion_mask[rows].sum(dim=1), ro.prompt_len):
            if len(chunk) == 0:  # fewer rows than chunks
                loss, stats = self._zero_loss(), None
            else:
                loss, stats = self._chunk_loss(step, rows[chunk], beta, aggregate, entropy)
            if not torch.isfinite(loss):
                nonfinite += 1
                # the backward still runs (on a zero loss) so that DDP ranks stay in lockstep
                loss, stats = self._zero_loss(), None
            self.manual_backward(loss)
            parts.append((loss.detach(), stats))
        grad_norm = gradient_norm(self.policy)
        local = torch.tensor([float(nonfinite > 0 or not torch.isfinite(grad_norm)), float(total_tokens)],
                             device=self.device)
        bad, tokens = self.trainer.strategy.reduce(local, reduce_op="sum").tolist()  # one reduce, every rank
        skip, empty = bad > 0, tokens == 0
        if skip:
            log.warning("step %d: non-finite %s; the update is skipped on every rank (weights unchanged)",
                        self.global_step,
                        f"loss in {nonfinite} chunk(s)" if nonfinite else f"gradient norm {grad_norm}")
        if skip or empty:
            optimizer.zero_grad(set_to_none=True)
            optimizer.step()  # counts the step; with no gradient the optimizer touches nothing
        else:
            if a.max_grad_norm is not None:
                self.clip_gradients(optimizer, gradient_clip_val=a.max_grad_norm, gradient_clip_algorithm="norm")
            optimizer.step()
            schedule.step()
        self.consecutive_skipped = self.consecutive_skipped + 1 if skip else 0
        return {"loss": sum(loss for loss, _ in parts), "nonfinite": torch.tensor(float(nonfinite), device=self.device),
                "skipped": torch.tensor(float(skip), device=self.device),
                **merge_stats([st for _, st in parts if st is not None], self.device)}

    def _chunk_loss(self, step: PreparedStep, rows: torch.Tensor, beta: float, aggregate, entropy: bool):
        """This chunk's part of the update loss, on its rows trimmed to their longest completion."""
        a = self.algo
        part = trim(select_rows(step.rollout, rows))
        t = part.completion_mask.shape[1]
        if entropy:
            logps, ent = token_logprobs(self.policy, part.input_ids, part.attention_mask, part.prompt_len,
                                        part.temperatures, with_entropy=True,
                                        length_groups=a.length_chunks)  # [c, t] each
        else:
            logps, ent = self._logprobs(self.policy, part), None  # [c, t]
        # with one update per rollout the policy is still the rollout policy: no extra forward
        old = logps.detach() if step.old_logps is None else step.old_logps[rows, :t]
        mask = step.mask[rows, :t]  # [c, t]
        loss, stats = policy_loss(
            logps, step.ref_logps[rows, :t], old, step.advantages[rows], mask, beta=beta,
            clip_eps_low=a.clip_eps_low, clip_eps_high=a.clip_eps_high, kl=a.kl_fn, aggregate=aggregate,
        )
        stats["tokens"] = mask.sum()
        if ent is not None:
            stats["entropy"] = (ent * mask).sum() / mask.sum().clamp(min=1)
        return loss, stats

    def _zero_loss(self) -> torch.Tensor:
        """0, but touching every weight, so every rank's backward reduces the same parameters."""
        return 0.0 * sum(p.sum() for p in self.policy.parameters())

    def _chunks(self, lengths: torch.Tensor, prompt_len: int) -> list[torch.Tensor]:
        """Length-sorted chunks when they save enough padded work, judged on the mean over ranks
        so that every rank runs the same number of backwards. Packed models compute no padding
        but in attention, which they group themselves (`length_groups`): one chunk."""
        k = 1 if packable(self.policy) else self.algo.length_chunks
        saving = chunk_saving(lengths, prompt_len, k)
        if k > 1 and self._trainer is not None:
            saving = float(self.trainer.strategy.reduce(torch.tensor(saving, device=self.device), reduce_op="mean"))
        return length_chunks(lengths, k if saving > CHUNK_WHEN_SAVING_ABOVE else 1)

    def _chunked_logprobs(self, model: torch.nn.Module, ro: Rollout, chunks: list[torch.Tensor]) -> torch.Tensor:
        """[N, T] log-probs, each chunk scored on its rows trimmed to their longest completion."""
        if len(chunks) == 1:
            return self._logprobs(model, ro)
        out = torch.zeros(ro.completion_mask.shape, dtype=torch.float32, device=ro.input_ids.device)  # [N, T]
        for chunk in chunks:
            if len(chunk):
                part = trim(select_rows(ro, chunk))
                out[chunk, : part.completion_mask.shape[1]] = self._logprobs(model, part)
        return out

    def _last_checkpoint_hint(self) -> str:
        ckpt = getattr(self.trainer.checkpoint_callback, "last_model_path", "") or ""
        return f"Last checkpoint: {ckpt}." if ckpt else "No checkpoint was saved yet."

    def _samples(self, sampled: SampledGroups, groups: torch.Tensor, advantages: torch.Tensor,
                 per_step: int = 4) -> list[dict]:
        """A few rows for the TensorBoard text samples: row b % G of each of the first groups."""
        G = self.rollout_settings.group_size
        position = {g: i for i, g in enumerate(groups.tolist())}  # group -> its index in the update
        rows = []
        for b in range(min(per_step, len(sampled.prompts))):
            g = b % G
            rows.append({"bucket": sampled.prompts[b].bucket, "prompt": sampled.prompts[b].prompt,
                         "completion": sampled.rollout.texts[b * G + g], "reward": sampled.rewards[b, g].item(),
                         "advantage": advantages[position[b] * G + g].item() if b in position else 0.0,
                         "temperature": sampled.rollout.temperatures[b * G + g].item()})
        return rows

    def _loss_mask(self, ro: Rollout, valid: torch.Tensor) -> torch.Tensor:
        """[B*G, T] float mask of the tokens that carry loss; valid: [B, G]."""
        a = self.algo
        mask = ro.completion_mask.float()  # [B*G, T] padding is already 0
        if a.mask_truncated:
            mask = truncation_mask(mask, ro.truncated)
        if a.template_patterns or a.repeat_ngram:
            patterns = a.compiled_templates
            for i, ids in enumerate(ro.input_ids[:, ro.prompt_len :].tolist()):
                n = int(ro.completion_mask[i].sum())
                keep = [1] * n
                if patterns:
                    template = template_mask([self._piece(t) for t in ids[:n]], patterns)
                    keep = [k * t for k, t in zip(keep, template, strict=True)]
                if a.repeat_ngram:
                    repeats = repetition_mask(ids[:n], a.repeat_ngram, a.repeat_max)
                    keep = [k * r for k, r in zip(keep, repeats, strict=True)]
                mask[i, :n] *= torch.tensor(keep, dtype=mask.dtype, device=mask.device)
        return mask * valid.reshape(-1, 1).to(mask.dtype)  # [B*G, T]

    def _piece(self, token_id: int) -> str:
        if token_id not in self._pieces:
            self._pieces[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=True)
        return self._pieces[token_id]

    def _log_step(self, step: PreparedStep, summary: dict[str, torch.Tensor], beta: float) -> None:
        sampled = step.sampled
        values = {
            "train/loss": summary["loss"].mean(),
            "train/reward": counted_mean(sampled.rewards, sampled.scored),
            "train/beta": torch.tensor(float(beta)),
            "train/effective_token_ratio": step.outputs["loss_tokens"] / step.outputs["generated_tokens"].clamp(min=1),
            "train/skipped_nonfinite": torch.tensor(float(self.skipped_total)),  # running count
        }
        if step.outputs["loss_tokens"] > 0:  # token statistics of an update without tokens are 0 / 0
            values["train/ratio_max"] = summary["ratio_max"].max()
            values["train/kl_max"] = summary["kl_max"].max()
            for name in ("clip_frac", "clip_frac_low", "clip_frac_high", "ratio_mean"):
                values[f"train/{name}"] = summary[name].mean()
        for name, scores in sampled.parts.items():
            scored = ~scores.isnan()
            if scored.any():
                values[f"reward/{name}/mean"] = scores[scored].mean()
            self.reward_errors[name] += sampled.errors[name]
            self.reward_timeouts[name] += sampled.timeouts[name]
            values[f"reward/errors/{name}"] = torch.tensor(float(self.reward_errors[name]))  # running count
            if self.reward.timed is not None:
                values[f"reward/timeouts/{name}"] = torch.tensor(float(self.reward_timeouts[name]))
        self.log_dict({k: values[k] for k in ("train/loss", "train/reward")}, prog_bar=True, logger=False)
        # written straight to the loggers at the optimizer step: with several updates per rollout,
        # Lightning's own logging step would count rollouts, not the steps every other curve uses
        window = self.global_step // self.trainer.log_every_n_steps
        if window > self.logged_window:
            self.logged_window = window
            scalars = {k: float(v) for k, v in values.items()}
            for logger in self.trainer.loggers:
                logger.log_metrics(scalars, step=self.global_step)

    def sample_round(self, prompts: list[Prompt]) -> SampledGroups:
        """Roll out G rows for each prompt in one batched call; score and dedup them."""
        s, G, a = self.rollout_settings, self.rollout_settings.group_size, self.algo
        n = len(prompts)
        temperatures = s.row_temperatures(n)  # [n*G] row g at temperature slot g
        ro = generate(self.policy, self.tokenizer, s.row_prompts(prompts), temperatures, s.top_p, s.max_new_tokens,
                      generator=self.generator)
        completions = [ro.texts[b * G : (b + 1) * G] for b in range(n)]
        scores = self.reward.score(prompts, completions)  # [n, G]
        lengths = ro.completion_mask.sum(dim=1)  # [n*G]
        shaping = overlong_penalty(lengths, s.max_new_tokens, a.overlong_buffer, a.overlong_penalty).view(n, G)
        rewards = (scores.total + shaping.cpu()).to(self.device)  # [n, G]
        distinct = s.dedup(completions).to(self.device)  # [n, G]
        # near-copies, unscorable or filtered rows, and groups with too few distinct rows leave
        # the loss and the group statistics
        valid = distinct & s.dedup.groups_kept(distinct)[:, None] & scores.kept.to(self.device)  # [n, G]
        return SampledGroups(prompts, ro, rewards, scores.parts, scores.errors, scores.timeouts, distinct,
                             scores.scored.to(self.device), valid, informative_groups(rewards, valid))

    def _logprobs(self, model: torch.nn.Module, ro: Rollout) -> torch.Tensor:
        return token_logprobs(model, ro.input_ids, ro.attention_mask, ro.prompt_len, ro.temperatures,
                              length_groups=self.algo.length_chunks)

    # -- greedy held-out accuracy per bucket ------------------------------------------------
    def validation_step(self, batch: list[Prompt], batch_idx: int) -> None:
        greedy = torch.zeros(len(batch))
        ro = generate(self.policy, self.tokenizer, [p.prompt for p in batch], greedy, 1.0, self.eval_max_new_tokens)
        scores = [self.exact(p, text) for p, text in zip(batch, ro.texts, strict=True)]
        correct = torch.tensor(scores, device=self.device)
        bucket = batch[0].bucket
        self.val_correct[bucket].update(correct.sum())
        self.val_total[bucket].update(torch.tensor(float(len(batch)), device=self.device))

    def on_validation_epoch_end(self) -> None:
        accuracy = {}
        for bucket in BUCKETS:
            total = self.val_total[bucket].compute()  # syncs across ranks: every rank calls it
            correct = self.val_correct[bucket].compute()
            if total > 0:
                accuracy[f"eval/accuracy/{bucket}"] = (correct / total).item()
            self.val_total[bucket].reset()
            self.val_correct[bucket].reset()
        self.last_eval = accuracy
        # written straight to the loggers: self.log would stamp a mid-training evaluation with
        # step - 1, and the step-0 baseline must sit at step 0
        for logger in self.trainer.loggers:
            logger.log_metrics(accuracy, step=self.global_step)
        if self.trainer.is_global_zero:
            shown = "  ".join(f"{k.rsplit('/', 1)[1]} {a:.3f}" for k, a in accuracy.items())
            log.info("step %d  greedy held-out accuracy: %s", self.global_step, shown)
