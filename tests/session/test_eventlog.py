"""EventLog: bounded, ordered, and replayable from the seed while complete."""

from __future__ import annotations

import pytest

from worldserve.session.eventlog import (
    ActionEvent,
    EpochStart,
    EventLog,
    ObservationEvent,
    SceneEvent,
    SettingsEvent,
)

START = EpochStart(seed=1, scene="hills", bucket=64, steps=4)


def test_replay_gives_each_block_the_inputs_in_force() -> None:
    log = EventLog(START)
    log.append(ActionEvent(0, 1, (1.0, 0.0)))
    log.append(ObservationEvent(1, "ab" * 32))
    log.append(SceneEvent(2, "desert"))
    log.append(ActionEvent(2, 4, (0.0, 1.0)))
    log.append(SettingsEvent(3, 32, 2))
    blocks = list(log.replay(5))
    assert [b.block_idx for b in blocks] == [0, 1, 2, 3, 4]
    assert [b.seq for b in blocks] == [1, 1, 4, 4, 4]
    assert blocks[0].action == (1.0, 0.0) and blocks[4].action == (0.0, 1.0)
    assert [b.scene for b in blocks] == ["hills", "hills", "desert", "desert", "desert"]
    assert [(b.bucket, b.steps) for b in blocks] == [(64, 4)] * 3 + [(32, 2)] * 2
    assert [tuple(o.digest for o in b.observations) for b in blocks] == [(), ("ab" * 32,), (), (), ()]


def test_replay_before_any_action_uses_no_action() -> None:
    block = next(EventLog(START).replay(1))
    assert (block.action, block.seq, block.scene) == ((), 0, "hills")


def test_log_is_bounded_and_counts_dropped_events() -> None:
    log = EventLog(START, capacity=3)
    for i in range(10):
        log.append(ActionEvent(i, i + 1, (1.0,)))
    assert len(log) == 3
    assert log.dropped == 7 and not log.complete
    assert [e.block_idx for e in log] == [7, 8, 9]


def test_incomplete_log_refuses_to_replay() -> None:
    log = EventLog(START, capacity=1)
    log.append(SceneEvent(0, "a"))
    log.append(SceneEvent(1, "b"))
    with pytest.raises(ValueError, match="dropped"):
        list(log.replay(2))


def test_events_must_not_go_back_in_block_order() -> None:
    log = EventLog(START)
    log.append(SceneEvent(3, "a"))
    log.append(SceneEvent(3, "b"))
    with pytest.raises(ValueError):
        log.append(SceneEvent(2, "c"))
    assert log.last_block_idx == 3


def test_from_events_rebuilds_an_equal_log() -> None:
    events = [ActionEvent(0, 1, (1.0,)), SceneEvent(2, "x")]
    log = EventLog.from_events(START, events, dropped=5, capacity=8)
    assert list(log) == events and log.dropped == 5 and log.capacity == 8


@pytest.mark.parametrize("capacity", [0, -1, 10**6])
def test_capacity_out_of_range_is_rejected(capacity: int) -> None:
    with pytest.raises(ValueError, match="capacity"):
        EventLog(START, capacity)


def _observed(block: int, value: int, size: int = 1024) -> ObservationEvent:
    import numpy as np

    from worldserve.session.eventlog import digest

    frame = np.full((size, size, 3), value, np.uint8)
    return ObservationEvent(block, digest(frame), frame)


def test_a_stream_of_large_observations_holds_at_most_the_frame_budget() -> None:
    from worldserve.session.eventlog import DEFAULT_FRAME_BYTES

    log = EventLog(START)  # a solid-colour 1024x1024 frame: a few KB as PNG, 3 MiB decoded
    for i in range(40):
        log.append(_observed(i, i))
    held = sum(e.frame.nbytes for e in log if isinstance(e, ObservationEvent) and e.frame is not None)
    assert held == log.frames_held <= DEFAULT_FRAME_BYTES
    assert log.frames_released > 0
    assert len(log) == 40  # every digest stays
    newest = [e for e in log if isinstance(e, ObservationEvent)][-1]
    assert newest.frame is not None  # the newest frames are the ones kept


def test_a_frame_over_the_budget_is_kept_as_its_digest_only() -> None:
    log = EventLog(START, frame_bytes=1000)
    log.append(_observed(0, 7, size=64))
    (event,) = log
    assert isinstance(event, ObservationEvent) and event.frame is None
    assert log.frames_held == 0 and log.frames_released == 1


def test_events_dropped_for_capacity_give_their_frame_bytes_back() -> None:
    log = EventLog(START, capacity=2, frame_bytes=10 * 64 * 64 * 3)
    for i in range(5):
        log.append(_observed(i, i, size=64))
    assert log.frames_held == 2 * 64 * 64 * 3 and log.frames_released == 0
