"""End-to-end runs: through the real entry point (a subprocess) where the exit code, stderr or the
process itself is the behaviour; through train(cfg) in this process otherwise."""

import json
import math

import pytest
import torch

from helpers import TINY, all_finite, kill_resume_and_compare, read_events, read_scalars, run_train, train_here

HEALTH = [
    "health/reward_mean",
    "health/reward_std",
    "health/effective_token_ratio",
    "health/kl_mean",
    "health/completion_length_mean",
    "train/loss",
    "rollout/unique_ratio",
    "rollout/groups_dropped_frac",
    "rollout/zero_std_frac",
    "rollout/reward_by_temperature/0.7",
    "rollout/reward_by_temperature/1",
]


def test_fast_run_logs_every_health_metric(tmp_path):
    # the untrained model scores 0 everywhere: with the zero-std filter (default) no group would
    # enter the update and the token metrics would rightly have no point
    result = run_train(tmp_path, ["debug=fast", *TINY, "rollout.filter.zero_std=false"])
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    scalars = read_scalars(run)
    for tag in HEALTH + ["eval/accuracy/easy", "eval/accuracy/medium", "eval/accuracy/hard"]:
        assert all_finite(scalars.get(tag, [])), f"{tag}: {scalars.get(tag)}"
    assert [step for step, _ in scalars["health/reward_mean"]] == [1, 2, 3, 4]  # every_n_steps=1
    assert [step for step, _ in scalars["eval/accuracy/easy"]] == [0, 2, 4]  # before step 1, then every 2
    for b in ("easy", "medium", "hard"):
        assert [step for step, _ in scalars[f"curriculum/weight/{b}"]] == [1, 2, 3, 4]
    # the bandit default starts with every bucket's value at 0.5: equal softmax weights, and the
    # explore share is spread evenly too, so each bucket's first weight is 1/3
    for b in ("easy", "medium", "hard"):
        assert scalars[f"curriculum/weight/{b}"][0][1] == pytest.approx(1 / 3, abs=1e-6)
    # mixed batches of 2 prompts: the mean bucket of each step is a multiple of 1/2
    assert {v for _, v in scalars["curriculum/bucket"]} <= {0.0, 0.5, 1.0, 1.5, 2.0}
    per_bucket = [k for k in scalars if k.startswith("health/reward_mean/")]
    assert per_bucket and all(all_finite(scalars[k]) and {s for s, _ in scalars[k]} <= {2, 4} for k in per_bucket)
    events = read_events(run)
    for name in ("rewards", "advantages", "lengths"):
        assert [s for s, _ in events["histograms"][f"distributions/{name}"]][:2] == [1, 2]
    # debug=fast: 2 prompts x G=4 per step -> 8 rewards and 8 lengths per histogram
    assert events["histograms"]["distributions/rewards"][0][1] == 8
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= events["hparams"]
    assert "final/eval/accuracy/easy" in scalars
    samples = [t for tag, rows in events["texts"].items() if tag.startswith("samples/") for _, t in rows]
    assert samples and "| prompt | completion | T | reward | advantage |" in samples[0] and "Q: What is" in samples[0]
    for tag in ("health/completion_length_p50", "health/length_polarisation", "health/entropy_mean",
                "health/truncation_rate", "health/kl_max", "health/adv_abs_mean", "health/group_std_low_frac"):
        assert all_finite(scalars.get(tag, [])), tag
    last = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] == 4
    assert all(k.startswith(("policy.", "val_")) for k in last["state_dict"])  # no reference weights
    assert (run / "policy" / "model.safetensors").is_file()


ACTING = ["prompts/selector=learned", "prompts.selector.predictor.warmup_groups=2", "prompts/difficulty=online",
          "rollout.oversample=2"]


def test_selector_online_difficulty_and_oversampling_log_and_checkpoint_their_state(tmp_path):
    train_here(tmp_path, ["debug=fast", *TINY, *ACTING, "trainer.max_steps=6"])
    run = tmp_path / "run"
    scalars = read_scalars(run)
    for tag in ("selector/skip_frac", "rollout/flat_rows_frac", "rollout/tokens_total", "rollout/oversample_std_gain",
                "health/junk_frac"):
        assert all_finite(scalars.get(tag, [])), f"{tag}: {scalars.get(tag)}"
    tokens = [v for _, v in scalars["rollout/tokens_total"]]
    assert tokens == sorted(tokens) and tokens[0] > 0
    # the untrained model is right only by chance: most groups are flat, and easy prompts it never
    # solved (pass rate <= 0.1) move to hard
    flat = [v for _, v in scalars["rollout/flat_rows_frac"]]
    assert all(0 <= v <= 1 for v in flat) and sum(flat) / len(flat) > 0.5
    assert scalars["curriculum/moved/easy_hard"][-1][1] > 0
    last = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    state = next(v for k, v in last.items() if k.endswith("PromptDataModule"))["history"]
    seen = last["run_state"]["feed"]["selector"]["seen"]  # groups the learned selector trained on
    assert seen >= 6 and sum(r["attempts"] for r in state["records"].values()) == seen
    assert all(r["last_seen"] <= 5 for r in state["records"].values())


def test_windows_without_loss_tokens_log_no_nan_anywhere(tmp_path):
    """An untrained model scores 0 everywhere: with the zero-std filter every group leaves the
    update, so no step has a loss token. Token-weighted curves get no point; nothing is NaN,
    the final hparams included."""
    train_here(tmp_path, ["debug=fast", *TINY, "rollout.filter.zero_std=true"])
    scalars = read_scalars(tmp_path / "run")
    assert scalars["health/zero_std_frac"] and all(v == 1.0 for _, v in scalars["health/zero_std_frac"])
    assert all(math.isfinite(v) for points in scalars.values() for _, v in points)
    for tag in ("health/kl_mean", "health/kl_max", "health/entropy_mean", "health/clip_frac", "train/clip_frac"):
        assert tag not in scalars, tag
    assert all_finite(scalars["train/skipped_nonfinite"]) and "final/health/reward_mean" in scalars


def test_fail_on_stops_the_run_with_the_alert(tmp_path):
    result = run_train(tmp_path, ["debug=fast", *TINY, "rollout.temperatures=[0.0]", "callbacks.alerts.window=2",
                                  "callbacks.alerts.fail_on=[low_std]", "trainer.max_steps=8"])
    assert result.returncode != 0
    assert "alert low_std" in result.stderr and "sampling is near-greedy" in result.stderr
    assert "callbacks.alerts.fail_on contains 'low_std'" in result.stderr
    scalars = read_scalars(tmp_path / "run")
    assert max(step for step, _ in scalars["health/reward_mean"]) == 2  # stopped at the second step
    texts = read_events(tmp_path / "run")["texts"]
    assert "near-greedy" in texts["alerts/low_std/message"][0][1]


def test_greedy_ladder_has_no_contrast_and_the_controller_raises_it(tmp_path):
    overrides = ["debug=fast", *TINY, "rollout.temperatures=[0.0]", "callbacks=[default,adaptive_temperature]",
                 "callbacks.adaptive_temperature.window=1", "callbacks.adaptive_temperature.patience=1",
                 "callbacks.adaptive_temperature.floor=0.0"]
    train_here(tmp_path, overrides)
    scalars = read_scalars(tmp_path / "run")
    assert scalars["health/reward_std"][0][1] == 0.0  # all rows greedy: identical, no spread
    tops = [v for _, v in scalars["rollout/temperature_max"]]
    assert tops[0] == pytest.approx(0.3) and tops == sorted(tops) and tops[-1] > tops[0]


def test_hf_model_from_a_saved_directory(tmp_path, tiny_model_dir):
    """model=hf loads any local save_pretrained directory, the path real models take."""
    train_here(tmp_path, ["debug=fast", "model=hf", f"model.name_or_path={tiny_model_dir}"])
    assert all_finite(read_scalars(tmp_path / "run")["health/reward_mean"])
    assert not (tmp_path / "cache").exists()  # nothing built: the given model was used as is


def test_resume_from_a_checkpoint_continues_at_the_saved_step(tmp_path):
    every4 = ["trainer.max_steps=6", "callbacks.checkpoint.every_n_train_steps=4"]
    train_here(tmp_path / "a", ["debug=fast", *TINY, *every4])
    ckpt = tmp_path / "a" / "run" / "checkpoints" / "step-4.ckpt"
    train_here(tmp_path / "b", ["debug=fast", *TINY, *every4, f"ckpt_path={ckpt}"])
    scalars = read_scalars(tmp_path / "b" / "run")
    assert [step for step, _ in scalars["health/reward_mean"]] == [5, 6]
    assert [step for step, _ in scalars["eval/accuracy/easy"]] == [6]  # no fresh-policy baseline on resume
    # the resumed steps drew what the uninterrupted run drew at steps 5 and 6
    uninterrupted = read_scalars(tmp_path / "a" / "run")
    for tag in ("curriculum/bucket", "curriculum/weight/easy"):
        assert scalars[tag] == uninterrupted[tag][4:], tag
    last = torch.load(tmp_path / "b" / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] == 6


MIXED = ["data.mix_buckets=true", "data.without_replacement=true", "data.batch_size=6", "prompts/curriculum=staged",
         "prompts.curriculum.stages=[{until:1.0,weights:{easy:0.5,medium:0.25,hard:0.25}}]"]


def test_mixed_batches_train_log_every_bucket_and_resume(tmp_path):
    """A resumed run draws the prompts the whole run drew and scores them alike (a reward with
    spread: the tiny model's math rewards are all 0)."""
    every4 = ["trainer.max_steps=6", "callbacks.checkpoint.every_n_train_steps=4", "rollout.filter.zero_std=false",
              "reward=similarity", "+callbacks.drawn._target_=helpers.DrawnPrompts"]
    train_here(tmp_path / "a", ["debug=fast", *TINY, *MIXED, *every4, f"+callbacks.drawn.out={tmp_path / 'a'}"])
    scalars = read_scalars(tmp_path / "a" / "run")
    # 6 slots at weights 1/2, 1/4, 1/4: 3 easy, 1 or 2 medium, the rest hard; mean bucket 0.67..0.83
    assert all(4 / 6 - 1e-6 <= v <= 5 / 6 + 1e-6 for _, v in scalars["curriculum/bucket"])
    for b in ("easy", "medium", "hard"):  # every bucket in every step
        assert [s for s, _ in scalars[f"health/reward_mean/{b}"]] == [2, 4, 6]
    ckpt = tmp_path / "a" / "run" / "checkpoints" / "step-4.ckpt"
    train_here(tmp_path / "b", ["debug=fast", *TINY, *MIXED, *every4, f"ckpt_path={ckpt}",
                                f"+callbacks.drawn.out={tmp_path / 'b'}"])
    resumed = read_scalars(tmp_path / "b" / "run")
    assert len({v for _, v in scalars["health/reward_mean/hard"]}) > 1  # rewards with spread
    for tag in ("curriculum/bucket", "health/reward_mean/hard", "health/reward_mean", "train/loss"):
        assert resumed[tag] == [(s, v) for s, v in scalars[tag] if s > 4], tag
    whole, cut = (json.loads((tmp_path / d / "drawn-rank0.json").read_text()) for d in ("a", "b"))
    assert sorted(cut) == ["5", "6"] and {s: whole[s] for s in ("5", "6")} == cut


def test_several_updates_per_rollout_count_optimizer_steps_and_resume(tmp_path):
    variant = ["algo.num_iterations=2", "algo.minibatches=2", "reward=soft_math", "algo/loss=token_mean",
               "rollout.filter.zero_std=false",
               "algo/beta=relax", "algo/kl=k2", "algo.clip_eps_high=0.28", "reward.overlong_buffer=2",
               "algo.repeat_ngram=2", "trainer.max_steps=8", "trainer.val_check_interval=1"]
    train_here(tmp_path / "a", ["debug=fast", *TINY, *variant])
    scalars = read_scalars(tmp_path / "a" / "run")
    # 2 rollouts x (2 iterations x 2 minibatches) = 8 optimizer steps; every curve is on that axis
    assert [step for step, _ in scalars["health/reward_mean"]] == [4, 8]
    assert [step for step, _ in scalars["train/clip_frac_high"]] == [4, 8]
    assert [step for step, _ in scalars["eval/accuracy/easy"]] == [0, 4, 8]
    for tag in ("train/ratio_max", "train/kl_max", "train/beta", "reward/soft_math/mean", "reward/errors/soft_math"):
        assert all_finite(scalars[tag]), tag
    ckpt = tmp_path / "a" / "run" / "checkpoints" / "last.ckpt"
    assert "beta" in torch.load(ckpt, map_location="cpu", weights_only=False)["run_state"]["update"]
    train_here(tmp_path / "b", ["debug=fast", *TINY, *variant, f"ckpt_path={ckpt}", "trainer.max_steps=12"])
    assert [step for step, _ in read_scalars(tmp_path / "b" / "run")["health/reward_mean"]] == [12]


def test_bad_config_fails_before_any_model_loads(tmp_path):
    """The message path through the real entry point; tests/test_configs.py checks the table in-process."""
    result = run_train(tmp_path, ["debug=fast", "rollout.temperatures=[0.7,-1.0]"])
    assert result.returncode != 0
    assert "rollout.temperatures[1] = -1.0 is negative" in result.stderr
    assert not (tmp_path / "cache").exists()  # nothing was built or loaded


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [[], ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]],
                         ids=["1-process", "2-rank-ddp"])
def test_sigkill_after_a_checkpoint_then_resume_auto_matches_an_uninterrupted_run(tmp_path, ranks):
    """Killed at the start of step 4, right after the step-3 checkpoint, mid health window
    (every 2 steps); resumed with resume=auto in the same run directory. Every later train/loss,
    health/*, rollout/* and eval/* point equals the uninterrupted run's. With 2 ranks every rank
    kills itself (a node lost whole), and each rank's random streams come back from the checkpoint."""
    common = ["debug=fast", *TINY, "trainer.max_steps=8", "callbacks.checkpoint.every_n_train_steps=3",
              "callbacks.health.every_n_steps=2", "callbacks.health.bucket_every_n_steps=4",
              "reward=similarity", "rollout.filter.zero_std=true", "rollout.filter.refill=true", *ACTING, *ranks]
    expected, compared = kill_resume_and_compare(tmp_path, common, kill_at=3)
    assert compared > 40 and any(s == 4 for s, _ in expected["health/reward_mean"])  # the window spans the kill
    # real updates, not an idle run: the policy moved away from the reference (the GRPO loss
    # itself is ~0 with one update per rollout: zero-mean advantages at ratio 1)
    assert any(v > 0 for s, v in expected["train/kl_max"] if s > 3)


@pytest.mark.slow
def test_ddp_two_cpu_processes(tmp_path):
    """trainer=ddp runs with two gloo processes on CPU and logs and prints from rank 0. Mixed batches
    of 3 per rank: the ranks hold different buckets, and still join the same collectives."""
    result = run_train(tmp_path, ["debug=fast", *TINY, "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
                                  *ACTING, *MIXED, "data.batch_size=3"])
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stderr + result.stdout
    assert "Starting with 2 processes" in out
    # one progress line and one summary: rank 0's (off a terminal the line is logged at the last step)
    assert out.count("GRPO  4/4  100%") == 1 and out.count("run summary: 4 GRPO steps") == 1, out[-3000:]
    scalars = read_scalars(tmp_path / "run")
    assert all_finite(scalars["health/reward_std"]) and all_finite(scalars["eval/accuracy/easy"])


@pytest.mark.slow
def test_preflight_passes_on_varied_groups_and_fails_when_greedy(tmp_path):
    # Not the default config: one of its 4 first batches is the bandit's exploratory hard batch
    # (all flat) and the sloppy warm-up leaves 0.44 of the easy groups flat, so check 1 fails,
    # although the run learns (docs/preflight.md). Starting on easy and sampling hotter leaves
    # groups with spread (zero-std share 0.30 when measured, against the 0.5 limit).
    varied = ["prompts/curriculum=adaptive", "rollout.temperatures=[1.5]"]
    ok = run_train(tmp_path / "a", ["mode=preflight", *varied], timeout=1200, cache=tmp_path / "cache")
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    assert "preflight passed" in ok.stdout and ok.stdout.count("PASS") == 3, ok.stdout
    assert "zero-std share by bucket: easy " in ok.stdout
    assert (tmp_path / "a" / "run" / "preflight.png").stat().st_size > 10_000
    greedy = run_train(tmp_path / "b", ["mode=preflight", *varied, "rollout.temperatures=[0.0]"],
                       cache=tmp_path / "cache")
    assert greedy.returncode == 1
    assert "preflight FAILED: group reward std is informative" in greedy.stdout
    assert "median within-group std 0.000" in greedy.stdout


@pytest.mark.slow
def test_default_run_learns_on_easy_and_medium(tmp_path):
    """The acceptance run: `python train.py` with no overrides; GRPO lifts easy held-out accuracy,
    medium's and, since the warm-up covers hard, hard's (from the shipped start, 0.155 / 0.435 /
    0.225, the same on every machine: +0.79, +0.37 and +0.45 with mixed batches drawn without
    replacement, 2026-12-05; +0.79, +0.38, +0.47 before; docs/default-run.md). The
    easy and medium bars are the ones set when seed 0 gained medium +0.08 only; they stay."""
    result = run_train(tmp_path, [], timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    scalars = read_scalars(tmp_path / "run")
    gains = {}
    for bucket in ("easy", "medium", "hard"):
        curve = sorted(scalars[f"eval/accuracy/{bucket}"])
        assert curve[0][0] == 0
        gains[bucket] = sum(v for _, v in curve[-3:]) / 3 - curve[0][1]
    assert gains["easy"] >= 0.30 and gains["medium"] >= 0.05 and gains["hard"] >= 0.10, gains
