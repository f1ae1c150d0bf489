"""Session: status transitions, block counters, tokens and logged inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.session.fakes import FakeClock, action
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


def test_actions_are_logged_once_per_change_against_their_block() -> None:
    session, _ = make()
    session.push_action(1, action(1.0))
    vec, seq = session.take_action(0)
    assert seq == 1 and vec[0] == 1.0
    session.take_action(1)  # held: nothing new to log
    session.push_action(2, action(0.0, 1.0))
    session.push_action(3, action(0.0, 0.0, 1.0))
    session.take_action(2)
    events = list(session.log)
    assert events == [
        ActionEvent(0, 1, tuple(action(1.0).tolist())),
        ActionEvent(2, 3, tuple(action(0.0, 0.0, 1.0).tolist())),
    ]


def test_action_for_an_earlier_block_than_the_log_is_refused_without_consuming() -> None:
    session, _ = make()
    session.set_scene("desert", block_idx=3)
    session.push_action(1, action(1.0))
    with pytest.raises(ValueError, match="block_idx 2"):
        session.take_action(2)
    assert session.controls.pending == 1


def test_push_action_touches_last_seen_and_needs_an_attached_client() -> None:
    clock = FakeClock()
    session, _ = make(clock)
    clock.advance(3.0)
    session.push_action(1, action(1.0))
    assert session.last_seen == clock.now
    session.detach()
    with pytest.raises(IllegalTransition):
        session.push_action(2, action(1.0))


def test_scene_change_is_logged_for_the_next_block() -> None:
    session, _ = make()
    session.accept_block(0)
    assert session.set_scene("desert")
    assert not session.set_scene("desert")
    assert session.scene == "desert"
    assert list(session.log) == [SceneEvent(1, "desert")]


def test_overlong_scene_is_rejected() -> None:
    session, _ = make()
    with pytest.raises(ValueError, match="scene"):
        session.set_scene("x" * 100_000)


def test_reconfigure_logs_bucket_and_steps_but_keeps_seed_and_mode() -> None:
    session, _ = make(seed=7)
    session.reconfigure(SessionConfig(seed=7, lookahead=0))
    assert list(session.log) == []
    session.reconfigure(SessionConfig(seed=7, steps=2, bucket=32), block_idx=4)
    assert list(session.log) == [SettingsEvent(4, 32, 2)]
    assert session.config.steps == 2
    with pytest.raises(ValueError, match="seed"):
        session.reconfigure(SessionConfig(seed=8))


def test_observation_is_logged_as_a_digest() -> None:
    session, _ = make()
    frame = np.zeros((8, 8, 3), np.uint8)
    digest = session.observe(frame)
    assert len(digest) == 64
    assert list(session.log) == [ObservationEvent(0, digest)]
    assert session.observe(frame.copy()) == digest
    assert session.observe(np.ones((8, 8, 3), np.uint8)) != digest


def test_out_of_order_log_block_is_a_value_error() -> None:
    session, _ = make()
    session.set_scene("a", block_idx=5)
    with pytest.raises(ValueError, match="block_idx 2"):
        session.set_scene("b", block_idx=2)
    # The default block never goes backwards.
    session.set_scene("c")
    assert [e.block_idx for e in session.log] == [5, 5]


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
