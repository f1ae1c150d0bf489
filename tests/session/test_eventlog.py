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
