"""SessionConfig validation and the latest-wins Controls queue."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.session.fakes import action
from worldserve.session.plan import ACTION_DIM, encode_action
from worldserve.session.session import Controls, SessionConfig


def test_default_config_is_valid() -> None:
    config = SessionConfig()
    assert config.mode == "push"
    assert isinstance(config.fps, float)


def test_int_fps_is_normalised_to_float() -> None:
    assert SessionConfig(fps=30).fps == 30.0
    assert isinstance(SessionConfig(fps=30).fps, float)


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("fps", 0),
        ("fps", -1.0),
        ("fps", math.nan),
        ("fps", math.inf),
        ("fps", "24"),
        ("fps", True),
        ("bucket", 0),
        ("bucket", 64.0),
        ("bucket", True),
        ("steps", 0),
        ("lookahead", -1),
        ("mode", "poll"),
        ("priority", 10**6),
        ("seed", -1),
        ("seed", 2**64),
    ],
)
def test_bad_config_value_is_rejected_and_quoted(field: str, bad: object) -> None:
    with pytest.raises(ValueError, match=field) as info:
        SessionConfig(**{field: bad})  # type: ignore[arg-type]
    assert repr(bad) in str(info.value)


def test_controls_start_with_no_action_and_seq_zero() -> None:
    vec, seq = Controls().latest()
    assert seq == 0
    assert vec.dtype == np.float32 and vec.shape == (ACTION_DIM,)
    assert not vec.any()


def test_latest_action_wins() -> None:
    controls = Controls()
    assert controls.push(1, action(1.0))
    assert controls.push(2, action(0.0, 1.0))
    vec, seq = controls.latest()
    assert seq == 2
    np.testing.assert_array_equal(vec, action(0.0, 1.0))


def test_action_with_old_or_equal_seq_is_ignored_and_counted() -> None:
    controls = Controls()
    controls.push(5, action(1.0))
    assert not controls.push(5, action(0.0, 1.0))
    assert not controls.push(3, action(0.0, 1.0))
    assert controls.ignored == 2
    assert controls.latest()[1] == 5
    np.testing.assert_array_equal(controls.latest()[0], action(1.0))


def test_seq_zero_is_ignored_because_zero_means_no_action() -> None:
    controls = Controls()
    assert not controls.push(0, action(1.0))
    assert controls.ignored == 1


def test_take_clears_pending_holds_latest_and_counts_superseded() -> None:
    controls = Controls()
    for seq in (1, 2, 3):
        controls.push(seq, action(float(seq % 2)))
    vec, seq = controls.take()
    assert seq == 3 and controls.pending == 0
    assert controls.superseded == 2
    # The held action persists into the next chunk (keys stay pressed).
    again, again_seq = controls.take()
    assert again_seq == 3
    np.testing.assert_array_equal(again, vec)
    assert controls.held()[1] == 3


def test_seq_must_keep_increasing_after_take() -> None:
    controls = Controls()
    controls.push(4, action(1.0))
    controls.take()
    assert not controls.push(4, action(0.0))
    assert controls.push(5, action(0.0))


def test_queue_is_bounded_and_never_grows() -> None:
    controls = Controls(maxlen=4)
    for seq in range(1, 101):
        controls.push(seq, action(1.0))
    assert controls.pending == 4
    assert controls.superseded == 96
    controls.take()
    assert controls.superseded == 99
    assert controls.latest()[1] == 100


def test_action_is_clipped_to_bounds_and_read_only() -> None:
    controls = Controls()
    controls.push(1, np.array([2.0, -1.0, 0.5, 1.0, 3.0, -7.0]))
    vec, _ = controls.latest()
    np.testing.assert_array_equal(vec, np.array([1.0, 0.0, 0.5, 1.0, 1.0, -1.0], np.float32))
    assert not vec.flags.writeable


def test_pushed_array_is_copied_not_aliased() -> None:
    controls = Controls()
    src = encode_action({"left"}, (0.25, 0.0))
    controls.push(1, src)
    src[:] = 0
    assert controls.latest()[0][2] == 1.0


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros(ACTION_DIM + 1),
        np.zeros((1, ACTION_DIM)),
        np.full(ACTION_DIM, np.nan),
        ["a"] * ACTION_DIM,
    ],
)
def test_malformed_action_raises_value_error(bad: object) -> None:
    with pytest.raises(ValueError):
        Controls().push(1, bad)  # type: ignore[arg-type]


def test_non_int_seq_raises_value_error() -> None:
    with pytest.raises(ValueError):
        Controls().push(True, action())
    with pytest.raises(ValueError):
        Controls().push(1.0, action())  # type: ignore[arg-type]
