"""SessionStore: block_idx epochs, capacity, LRU eviction of detached sessions, TTL,
resume with token, and dispose-exactly-once."""

from __future__ import annotations

import logging

import pytest

from tests.session.fakes import DisposeRecorder, FakeClock
from worldserve.session.errors import (
    AtCapacity,
    BadToken,
    IllegalTransition,
    SessionStateMissing,
    StaleBlock,
)
from worldserve.session.session import Session, SessionConfig, SessionStatus
from worldserve.session.store import BlockKind, SessionStore

CONFIG = SessionConfig()


def make_store(
    capacity: int = 4, ttl: float = 10.0
) -> tuple[SessionStore, FakeClock, DisposeRecorder]:
    clock, disposed = FakeClock(), DisposeRecorder()
    store = SessionStore(capacity, ttl, clock=clock, on_dispose=disposed, retry_after_s=2.5)
    return store, clock, disposed


def open_new(store: SessionStore) -> tuple[Session, str]:
    decision = store.open_block(None, 0, config=CONFIG)
    assert decision.token is not None
    return decision.session, decision.token


def test_block_zero_without_id_creates_a_session_with_a_token() -> None:
    store, _, _ = make_store()
    decision = store.open_block(None, 0, config=CONFIG, scene="hills")
    assert decision.kind is BlockKind.NEW_SESSION and decision.new_epoch
    assert decision.token is not None and decision.session.check_token(decision.token)
    assert decision.token not in repr(decision)
    assert decision.session_id in store and len(store) == 1
    assert decision.session.scene == "hills"
    assert decision.session.last_block_idx == 0


def test_new_session_needs_a_config() -> None:
    store, _, _ = make_store()
    with pytest.raises(ValueError, match="config"):
        store.open_block(None, 0)


def test_next_block_advances_and_retransmit_returns_the_same_result() -> None:
    store, _, _ = make_store()
    session, _ = open_new(store)
    first = store.open_block(session.id, 1)
    assert first.kind is BlockKind.NEXT and not first.retransmit
    again = store.open_block(session.id, 1)
    assert again.retransmit
    assert (again.session, again.block_idx, again.epoch) == (first.session, 1, first.epoch)
    assert session.frames_due == 2  # the retransmit added no work


def test_block_idx_gap_is_rejected_as_stale() -> None:
    store, _, _ = make_store()
    session, _ = open_new(store)
    store.open_block(session.id, 1)
    with pytest.raises(StaleBlock) as info:
        store.open_block(session.id, 3)
    assert (info.value.got, info.value.last) == (3, 1)


def test_block_idx_rewind_is_rejected_as_stale() -> None:
    store, _, _ = make_store()
    session, _ = open_new(store)
    for n in (1, 2, 3):
        store.open_block(session.id, n)
    with pytest.raises(StaleBlock) as info:
        store.open_block(session.id, 1)
    assert (info.value.got, info.value.last) == (1, 3)


def test_block_zero_on_existing_id_starts_a_new_epoch_and_disposes_old_state() -> None:
    store, _, disposed = make_store()
    old, token = open_new(store)
    store.open_block(old.id, 1)
    decision = store.open_block(old.id, 0)
    new = decision.session
    assert decision.kind is BlockKind.NEW_EPOCH and decision.token is None
    assert new is not old and new.id == old.id
    assert new.epoch == old.epoch + 1 == decision.epoch
    assert (new.last_block_idx, new.blocks_committed) == (0, 0)
    assert new.check_token(token)
    assert old.status is SessionStatus.CLOSED and disposed.count(old) == 1
    assert store.get(old.id) is new and len(store) == 1


def test_new_epoch_keeps_config_and_scene_unless_given() -> None:
    store, _, _ = make_store()
    decision = store.open_block(None, 0, config=CONFIG, scene="hills")
    kept = store.open_block(decision.session_id, 0).session
    assert (kept.config, kept.scene) == (CONFIG, "hills")
    other = SessionConfig(bucket=128)
    changed = store.open_block(decision.session_id, 0, config=other, scene="sea").session
    assert (changed.config, changed.scene, changed.epoch) == (other, "sea", 2)


def test_block_zero_on_a_detached_session_needs_resume_first() -> None:
    store, _, _ = make_store()
    session, _ = open_new(store)
    store.detach(session.id)
    with pytest.raises(IllegalTransition):
        store.open_block(session.id, 0)


@pytest.mark.parametrize("block_idx", [1, 5])
def test_unknown_session_with_block_above_zero_is_missing_state_never_fabricated(
    block_idx: int,
) -> None:
    store, _, _ = make_store()
    with pytest.raises(SessionStateMissing, match="missing session state") as info:
        store.open_block("nobody", block_idx)
    assert (info.value.session_id, info.value.block_idx) == ("nobody", block_idx)
    with pytest.raises(SessionStateMissing):
        store.open_block(None, block_idx, config=CONFIG)
    assert len(store) == 0


def test_block_zero_for_an_unknown_id_is_missing_state() -> None:
    store, _, _ = make_store()
    with pytest.raises(SessionStateMissing):
        store.open_block("forgotten", 0, config=CONFIG)
    assert len(store) == 0


def test_evicted_session_is_missing_state() -> None:
    store, _, disposed = make_store(capacity=1)
    session, _ = open_new(store)
    store.detach(session.id)
    open_new(store)  # evicts the detached one
    assert disposed.count(session) == 1 and store.evicted == 1
    with pytest.raises(SessionStateMissing):
        store.open_block(session.id, 1)


def test_full_store_of_active_sessions_refuses_with_retry_after() -> None:
    store, _, disposed = make_store(capacity=2)
    a, _ = open_new(store)
    b, _ = open_new(store)
    with pytest.raises(AtCapacity) as info:
        open_new(store)
    assert (info.value.capacity, info.value.retry_after_s) == (2, 2.5)
    assert {s.id for s in store} == {a.id, b.id}
    assert not disposed.calls


def test_active_sessions_are_never_evicted_to_make_room() -> None:
    store, _, _ = make_store(capacity=3)
    active = [open_new(store)[0] for _ in range(2)]
    detached, _ = open_new(store)
    store.detach(detached.id)
    open_new(store)
    assert all(s.id in store for s in active)
    assert detached.id not in store
    with pytest.raises(AtCapacity):
        open_new(store)
    assert all(s.status is SessionStatus.ACTIVE for s in store)


def test_detached_sessions_are_evicted_least_recently_detached_first() -> None:
    store, clock, _ = make_store(capacity=3)
    sessions = [open_new(store)[0] for _ in range(3)]
    for s in (sessions[1], sessions[0], sessions[2]):
        clock.advance(1.0)
        store.detach(s.id)
    open_new(store)
    assert sessions[1].id not in store
    open_new(store)
    assert sessions[0].id not in store and sessions[2].id in store


def test_evict_one_takes_only_detached_sessions() -> None:
    store, _, _ = make_store()
    active, _ = open_new(store)
    assert store.evict_one() is None
    detached, _ = open_new(store)
    store.detach(detached.id)
    assert store.evict_one() is detached
    assert active.id in store and len(store) == 1


def test_resume_with_the_token_reattaches() -> None:
    store, _, _ = make_store()
    session, token = open_new(store)
    store.detach(session.id)
    assert (store.active_count, store.detached_count) == (0, 1)
    assert store.resume(session.id, token) is session
    assert session.status is SessionStatus.ACTIVE
    assert (store.active_count, store.detached_count) == (1, 0)
    assert store.open_block(session.id, 1).kind is BlockKind.NEXT


def test_resume_with_a_wrong_token_is_bad_token_and_changes_nothing() -> None:
    store, _, _ = make_store()
    session, token = open_new(store)
    store.detach(session.id)
    with pytest.raises(BadToken) as info:
        store.resume(session.id, "not-the-token")
    assert token not in str(info.value)
    assert session.status is SessionStatus.DETACHED


def test_wrong_token_is_reported_before_status() -> None:
    store, _, _ = make_store()
    session, token = open_new(store)
    with pytest.raises(BadToken):
        store.resume(session.id, "guess")
    with pytest.raises(IllegalTransition):  # attached elsewhere: detach that one first
        store.resume(session.id, token)


def test_resume_of_an_unknown_session_is_missing_state() -> None:
    store, _, _ = make_store()
    with pytest.raises(SessionStateMissing):
        store.resume("nobody", "token")


def test_detached_session_expires_after_ttl_even_before_reap() -> None:
    store, clock, disposed = make_store(ttl=10.0)
    session, token = open_new(store)
    store.detach(session.id)
    clock.advance(9.9)
    assert store.peek(session.id) is session
    clock.advance(0.1)
    assert store.peek(session.id) is None
    with pytest.raises(SessionStateMissing):
        store.resume(session.id, token)
    assert disposed.count(session) == 1 and session.id not in store
    assert store.expired == 1


def test_reap_removes_only_expired_detached_sessions() -> None:
    store, clock, disposed = make_store(ttl=5.0)
    active, _ = open_new(store)
    old, _ = open_new(store)
    young, _ = open_new(store)
    store.detach(old.id)
    clock.advance(3.0)
    store.detach(young.id)
    clock.advance(3.0)
    assert store.reap() == [old.id]
    assert active.id in store and young.id in store
    assert store.reap(clock.now + 100.0) == [young.id]
    assert [disposed.count(s) for s in (active, old, young)] == [0, 1, 1]


def test_resumed_then_detached_again_gets_a_fresh_ttl() -> None:
    store, clock, _ = make_store(ttl=5.0)
    session, token = open_new(store)
    store.detach(session.id)
    clock.advance(4.0)
    store.resume(session.id, token)
    store.detach(session.id)
    clock.advance(4.0)
    assert store.reap() == []


def test_close_disposes_once_and_is_idempotent_at_the_store() -> None:
    store, _, disposed = make_store()
    session, _ = open_new(store)
    assert store.close(session.id)
    assert not store.close(session.id)
    assert disposed.count(session) == 1
    assert session.status is SessionStatus.CLOSED
    with pytest.raises(SessionStateMissing):
        store.open_block(session.id, 1)


def test_clear_disposes_every_session() -> None:
    store, _, disposed = make_store()
    sessions = [open_new(store)[0] for _ in range(3)]
    store.detach(sessions[0].id)
    store.clear()
    assert len(store) == 0 and store.detached_count == 0
    assert [disposed.count(s) for s in sessions] == [1, 1, 1]


def test_failing_dispose_is_logged_with_the_id_and_swallowed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def explode(session: Session) -> None:
        raise RuntimeError("teardown failed")

    store = SessionStore(2, 10.0, clock=FakeClock(), on_dispose=explode)
    session = store.open_block(None, 0, config=CONFIG).session
    with caplog.at_level(logging.ERROR, logger="worldserve.session.store"):
        assert store.close(session.id)
    assert session.id in caplog.text and "teardown failed" in caplog.text
    assert store.dispose_failures == 1 and len(store) == 0
    # The store still works.
    store.open_block(None, 0, config=CONFIG)
    assert len(store) == 1


def test_dispose_hook_may_call_back_into_the_store() -> None:
    also_close: list[str] = []

    def hook(session: Session) -> None:
        while also_close:
            store.close(also_close.pop())

    store = SessionStore(4, 10.0, clock=FakeClock(), on_dispose=hook)
    a = store.open_block(None, 0, config=CONFIG).session
    b = store.open_block(None, 0, config=CONFIG).session
    also_close.append(b.id)
    store.close(a.id)
    assert len(store) == 0


def test_get_marks_the_session_used_and_peek_does_not() -> None:
    store, clock, _ = make_store()
    a, _ = open_new(store)
    b, _ = open_new(store)
    clock.advance(1.0)
    assert store.peek(a.id) is a and a.last_seen < clock.now
    assert [s.id for s in store] == [a.id, b.id]
    assert store.get(a.id) is a and a.last_seen == clock.now
    assert [s.id for s in store] == [b.id, a.id]
    with pytest.raises(SessionStateMissing):
        store.get("nobody")


def test_commit_block_goes_to_the_session_and_needs_state() -> None:
    store, _, _ = make_store()
    session, _ = open_new(store)
    store.commit_block(session.id, 0)
    assert session.blocks_committed == 1
    with pytest.raises(SessionStateMissing):
        store.commit_block("nobody", 0)


def test_install_adds_a_restored_detached_session_under_capacity_rules() -> None:
    store, clock, _ = make_store(capacity=1)
    restored, token = Session.create(CONFIG, clock=clock)
    restored.detach()
    store.install(restored)
    assert store.detached_count == 1
    with pytest.raises(ValueError, match="already"):
        store.install(restored)
    assert store.resume(restored.id, token) is restored
    other, _ = Session.create(CONFIG, clock=clock)
    with pytest.raises(AtCapacity):
        store.install(other)


def test_session_closed_behind_the_stores_back_reads_as_missing() -> None:
    store, _, disposed = make_store()
    session, _ = open_new(store)
    session.close()
    assert store.peek(session.id) is None
    with pytest.raises(SessionStateMissing):
        store.get(session.id)
    assert disposed.count(session) == 1 and len(store) == 0


@pytest.mark.parametrize(
    "kwargs",
    [{"capacity": 0}, {"capacity": True}, {"detached_ttl_s": -1.0}, {"retry_after_s": 0.0}],
)
def test_bad_store_settings_are_rejected(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"capacity": 2, "detached_ttl_s": 1.0} | kwargs
    with pytest.raises(ValueError):
        SessionStore(**args)  # type: ignore[arg-type]
