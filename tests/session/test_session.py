"""Session: status transitions, block counters, tokens and logged inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.session.fakes import FakeClock, action, applied
from worldserve.session.errors import IllegalTransition, StaleBlock
from worldserve.session.eventlog import ActionEvent, ObservationEvent, SceneEvent, SettingsEvent
from worldserve.session.session import Session, SessionConfig, SessionStatus, hash_token


def make(clock: FakeClock | None = None, **config: object) -> tuple[Session, str]:
    return Session.create(SessionConfig(**config), scene="hills", clock=clock or FakeClock())  # type: ignore[arg-type]


def test_new_session_is_active_with_fresh_counters_and_timestamps() -> None:
    clock = FakeClock(5.0)
    session, _ = make(clock)
    assert session.status is SessionStatus.ACTIVE
    assert (session.epoch, session.blocks_committed, session.last_block_idx) == (0, 0, -1)
    assert (session.frames_due, session.frames_committed) == (0, 0)
    assert session.created_at == session.last_seen == 5.0
    assert math.isnan(session.detached_at)


def test_ids_and_tokens_are_unique_and_unguessable() -> None:
    pairs = [make() for _ in range(50)]
    assert len({s.id for s, _ in pairs}) == 50
    assert len({t for _, t in pairs}) == 50
    assert all(len(t) >= 32 for _, t in pairs)


def test_token_is_checked_and_only_its_hash_is_kept() -> None:
    session, token = make()
    assert session.check_token(token)
    assert not session.check_token(token + "x")
    assert not session.check_token("")
    assert not session.check_token(None)  # type: ignore[arg-type]
    assert session.token_hash == hash_token(token)
    assert token not in repr(session)


def test_detach_then_attach_round_trips() -> None:
    clock = FakeClock()
    session, _ = make(clock)
    clock.advance(2.0)
    session.detach()
    assert session.status is SessionStatus.DETACHED
    assert session.detached_at == clock.now
    clock.advance(1.0)
    session.attach()
    assert session.status is SessionStatus.ACTIVE
    assert session.last_seen == clock.now
    assert math.isnan(session.detached_at)


@pytest.mark.parametrize(
    ("setup", "call"),
    [
        ([], "attach"),
        (["detach"], "detach"),
        (["close"], "close"),
        (["close"], "attach"),
        (["close"], "detach"),
    ],
)
def test_illegal_transition_names_session_status_and_action(setup: list[str], call: str) -> None:
    session, _ = make()
    for name in setup:
        getattr(session, name)()
    with pytest.raises(IllegalTransition) as info:
        getattr(session, call)()
    assert info.value.session_id == session.id
    assert info.value.from_status == session.status.value
    assert call in info.value.action


def test_next_block_is_accepted_and_counted() -> None:
    session, _ = make()
    assert session.accept_block(0, frames=2)
    assert session.accept_block(1, frames=2)
    assert session.last_block_idx == 1
    assert session.frames_due == 4


def test_retransmit_of_last_block_is_no_new_work() -> None:
    session, _ = make()
    session.accept_block(0)
    session.accept_block(1)
    assert not session.accept_block(1)
    assert (session.last_block_idx, session.frames_due) == (1, 2)


@pytest.mark.parametrize("bad", [2, 3, -1, -5])
def test_block_idx_gap_or_rewind_is_rejected_as_stale(bad: int) -> None:
    session, _ = make()
    session.accept_block(0)
    with pytest.raises(StaleBlock) as info:
        session.accept_block(bad)
    assert (info.value.got, info.value.last) == (bad, 0)


def test_first_block_must_be_zero() -> None:
    session, _ = make()
    with pytest.raises(StaleBlock):
        session.accept_block(1)
    with pytest.raises(StaleBlock):
        session.accept_block(-1)


def test_accepting_a_block_needs_an_attached_client() -> None:
    session, _ = make()
    session.detach()
    with pytest.raises(IllegalTransition):
        session.accept_block(0)


def test_commit_is_in_order_once_and_only_for_accepted_blocks() -> None:
    session, _ = make()
    session.accept_block(0)
    session.accept_block(1)
    with pytest.raises(StaleBlock):
        session.commit_block(1)
    session.commit_block(0)
    with pytest.raises(StaleBlock):
        session.commit_block(0)
    session.commit_block(1)
    with pytest.raises(StaleBlock):
        session.commit_block(2)  # not accepted yet
    assert (session.blocks_committed, session.frames_committed) == (2, 2)


def test_block_in_flight_may_commit_after_detach_but_not_after_close() -> None:
    session, _ = make()
    session.accept_block(0)
    session.accept_block(1)
    session.detach()
    session.commit_block(0)
    session.close()
    with pytest.raises(IllegalTransition):
        session.commit_block(1)


def test_commit_cannot_finish_more_frames_than_due() -> None:
    session, _ = make()
    session.accept_block(0, frames=1)
    with pytest.raises(ValueError):
        session.commit_block(0, frames=2)


def test_a_block_logs_what_it_was_made_with_changes_only() -> None:
    session, _ = make()
    frame = np.zeros((8, 8, 3), np.uint8)
    out = np.ones((1, 8, 8, 3), np.uint8)
    session.record_block(0, applied(action(), 0, observations=(frame,)), out)  # zeros: no event
    session.record_block(1, applied(action(1.0), 1), out)
    session.record_block(2, applied(action(1.0), 1), out)  # held: nothing new
    session.record_block(3, applied(action(0.0, 1.0), 3, scene="desert"), out)
    session.record_block(4, applied(action(0.0, 1.0), 3, scene="desert", steps=2), out)
    events = list(session.log)
    digest = events[0].digest
    assert events == [
        ObservationEvent(0, digest),
        ActionEvent(1, 1, tuple(action(1.0).tolist())),
        SceneEvent(3, "desert"),
        ActionEvent(3, 3, tuple(action(0.0, 1.0).tolist())),
        SettingsEvent(4, 64, 2),
    ]
    assert np.array_equal(events[0].frame, frame) and len(digest) == 64
    assert [b for b, _ in session.log.outputs] == [0, 1, 2, 3, 4]
    assert len({d for _, d in session.log.outputs}) == 1  # the same frames, the same digest


def test_a_new_scene_is_logged_with_the_first_block_made_with_it() -> None:
    session, _ = make()
    session.accept_block(0)
    assert session.set_scene("desert")
    assert not session.set_scene("desert")
    assert session.scene == "desert"
    assert list(session.log) == []  # not made with it yet


def test_overlong_scene_is_rejected() -> None:
    session, _ = make()
    with pytest.raises(ValueError, match="scene"):
        session.set_scene("x" * 100_000)


def test_out_of_order_log_block_is_a_value_error() -> None:
    session, _ = make()
    out = np.ones((1, 8, 8, 3), np.uint8)
    session.record_block(5, applied(action(1.0), 1), out)
    with pytest.raises(ValueError, match="block_idx 2"):
        session.record_block(2, applied(action(0.0, 1.0), 2), out)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"session_id": "has space"},
        {"session_id": ""},
        {"session_id": "x" * 200},
        {"last_block_idx": 2, "blocks_committed": 4},
        {"frames_due": 1, "frames_committed": 2},
        {"status": SessionStatus.CLOSED},
        {"epoch": -1},
    ],
)
def test_inconsistent_session_state_is_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Session(SessionConfig(), hash_token("t"), **kwargs)  # type: ignore[arg-type]


def test_token_hash_must_be_sha256_sized() -> None:
    with pytest.raises(ValueError, match="token_hash"):
        Session(SessionConfig(), b"short")
