"""Multi-turn environments: reset from the record, an observation after every turn, done ends
the episode, the environment's reward joins the row's total; a failing step ends the row."""

import math

import pytest
import torch
from tool_fixtures import Scripted

from grpo_aug.data.records import Prompt
from grpo_aug.engines.turns import MultiTurnEngine
from grpo_aug.models.loading import load_tokenizer
from grpo_aug.rewards import RewardFunction, RewardSet
from grpo_aug.tools.environment import EnvironmentTools

PROMPT = "Q: guess\nA: "
RECORD = Prompt(id="g", bucket="easy", question="guess", prompt=PROMPT, solution="#### 3", answer="3")


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


def test_an_episode_by_hand(tok):
    tools = EnvironmentTools("tool_fixtures.GuessTheAnswer", stop=["\n"], max_transcript_tokens=64)
    script = {PROMPT + "Guess it.\n": ("5\n", False),
              PROMPT + "Guess it.\n5\nlower\n": ("3\n", False)}
    engine = Scripted(script)
    ro = MultiTurnEngine(engine, tools).generate(torch.nn.Linear(1, 1), tok, [PROMPT], torch.ones(1), 1.0, 40,
                                                 records=[RECORD])
    # "Guess it.\n" (10, given) "5\n" (2) "lower\n" (6, given) "3\n" (2) "right!" (6, given)
    assert ro.given[0].tolist() == [True] * 10 + [False] * 2 + [True] * 6 + [False] * 2 + [True] * 6
    assert ro.texts == ["Guess it.\n5\nlower\n3\nright!"]
    assert ro.segments[0] == [("environment", "Guess it.\n"), ("policy", "5\n"), ("environment", "lower\n"),
                              ("policy", "3\n"), ("environment", "right!")]
    assert not ro.truncated[0]  # the episode ended: finished, not cut off
    assert ro.tool_calls.tolist() == [2] and ro.env_rewards.tolist() == [0.5]
    assert [limits for _, limits in engine.calls] == [[40], [38]]


def test_a_failing_step_ends_the_row_with_its_error(tok):
    tools = EnvironmentTools("tool_fixtures.Broken", stop=["\n"], max_transcript_tokens=64)
    engine = Scripted({PROMPT + "Guess it.\n": ("5\n", False)})
    ro = MultiTurnEngine(engine, tools).generate(torch.nn.Linear(1, 1), tok, [PROMPT], torch.ones(1), 1.0, 40,
                                                 records=[RECORD])
    assert ro.texts == ["Guess it.\n5\nerror: KeyError: 'no such move'"]
    assert ro.truncated.tolist() == [True] and ro.tool_failures.tolist() == [1] and len(engine.calls) == 1
    assert ro.env_rewards.tolist() == [0.0]


def test_the_environments_reward_joins_the_total_as_a_part():
    rewards = RewardSet([RewardFunction(lambda p, c: 1.0)])
    scores = rewards.score([RECORD, RECORD], [["a", "b"], ["c"]])  # groups of 2 and 1 rows
    env = torch.tensor([0.5, math.nan, 0.25])
    out = scores.with_part("environment", env, [2, 1], weight=2.0)
    assert out.total.tolist() == [[2.0, 0.0], [1.5, 0.0]]  # 1 + 2 x 0.5; unscorable; 1 + 2 x 0.25; absent
    assert out.scored.tolist() == [[True, False], [True, False]]
    assert out.parts["environment"][0].tolist()[0] == 0.5 and out.errors["environment"] == 0


def test_environment_settings_are_checked():
    with pytest.raises(ValueError, match="rollout.tools.factory: cannot import 'nope.Env'"):
        EnvironmentTools("nope.Env")
    with pytest.raises(ValueError, match="rollout.tools.stop must be a non-empty list"):
        EnvironmentTools("tool_fixtures.GuessTheAnswer", stop=[])
    with pytest.raises(ValueError, match="called without the rows' records"):
        EnvironmentTools("tool_fixtures.GuessTheAnswer").session(None, 1)


def test_an_environment_run_composes_from_config_and_trains(tmp_path):
    """rollout/tools=environment by config on the tiny model: a turn ends at a space, a vowel or a digit
    (a random model writes one of them every few tokens), the environment's reward is logged as its own part."""
    from helpers import TINY, read_scalars, train_here

    stops = "rollout.tools.stop=[' ',a,e,i,o,u," + ",".join(f"'{d}'" for d in range(10)) + "]"
    train_here(tmp_path, ["debug=fast", *TINY, "rollout/tools=environment",
                          "rollout.tools.factory=tool_fixtures.GuessTheAnswer", stops,
                          "rollout.max_new_tokens=12", "trainer.max_steps=2", "validate_before_training=false"])
    scalars = read_scalars(tmp_path / "run")
    assert [s for s, _ in scalars["reward/environment/mean"]] == [1, 2]
    assert all(v > 0.5 for _, v in scalars["tools/calls_per_row"])  # most rows took a turn or more
    assert all(v > 0.1 for _, v in scalars["tools/token_share"])  # "Guess it.\n" and the answers: no loss
