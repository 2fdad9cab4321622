import pytest

from grpo_aug.callbacks import AdaptiveTemperature
from grpo_aug.rollout.settings import RolloutSettings


def _controller(**kw):
    c = AdaptiveTemperature(window=2, patience=2, low=0.3, high=2.0, increment=0.3, max_temperature=1.7, **kw)
    c.ladder = [0.7, 1.0, 1.2]
    return c


def _feed(c, stds, mean=0.5):
    return [c.observe(s, mean) for s in stds]


def test_scripted_std_raises_then_lowers():
    c = _controller()
    # window 1 mean 0.1 (low 1), window 2 mean 0.2 (low 2 -> add 1.5)
    changes = _feed(c, [0.1, 0.1, 0.2, 0.2])
    assert changes[:3] == [None, None, None] and "added rung 1.5" in changes[3]
    assert c.ladder == [0.7, 1.0, 1.2, 1.5]
    # two more low windows: 1.5 + 0.3 = 1.8, capped at 1.7
    _feed(c, [0.0] * 4)
    assert c.ladder == [0.7, 1.0, 1.2, 1.5, 1.7]
    # at the ceiling: no more rungs
    _feed(c, [0.0] * 4)
    assert c.ladder == [0.7, 1.0, 1.2, 1.5, 1.7]
    # a window with mean std 2.5 > high removes the top rung
    changes = _feed(c, [3.0, 2.0])
    assert "removed rung 1.7" in changes[1] and c.ladder == [0.7, 1.0, 1.2, 1.5]


def test_a_healthy_window_resets_patience():
    c = _controller()
    _feed(c, [0.1, 0.1, 0.5, 0.5, 0.1, 0.1])  # low, healthy, low: never two low in a row
    assert c.ladder == [0.7, 1.0, 1.2]


def test_swing_removes_top_rung_and_floor_holds():
    c = _controller(swing=0.2, floor=1.0)
    assert c.observe(0.5, 0.0) is None
    assert "removed rung 1.2" in c.observe(0.5, 1.0)  # per-step means 0, 1: pstdev 0.5 > 0.2
    assert c.ladder == [0.7, 1.0]
    _feed(c, [0.5, 0.5], mean=0.0)
    c.observe(0.5, 0.0)
    c.observe(0.5, 1.0)  # would remove 1.0, leaving top 0.7 < floor 1.0: kept
    assert c.ladder == [0.7, 1.0]


def test_state_survives_round_trip():
    c = _controller()
    _feed(c, [0.1, 0.1, 0.2])  # one low window done, one step into the next
    restored = AdaptiveTemperature(window=2, patience=2)
    restored.load_state_dict(c.state_dict())
    assert restored.ladder == c.ladder and restored.low_windows == 1 and restored.stds == [0.2]
    assert "added rung 1.5" in restored.observe(0.2, 0.5)


def test_max_temperature_below_ladder_fails():
    with pytest.raises(ValueError, match="max_temperature=1.0 is below the ladder's top rung 1.5"):
        AdaptiveTemperature(max_temperature=1.0, floor=0.5).check_rollout(RolloutSettings())
