"""The store's rules under random interleavings, checked against a small model.

Hypothesis drives open / chunk(block_idx) / detach / resume / evict / expire / close on a
real ``SessionStore`` and on a plain-dict model of the rules, and after every step checks
the invariants: never more than capacity, the same sessions in the same states as the
model (so no active session was ever evicted and nothing was fabricated), and every
removed session disposed exactly once.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.session.fakes import FakeClock
from worldserve.session.errors import (
    AtCapacity,
    BadToken,
    IllegalTransition,
    SessionStateMissing,
    StaleBlock,
)
from worldserve.session.session import Session, SessionConfig, SessionStatus
from worldserve.session.store import BlockKind, SessionStore

CAPACITY = 3
TTL = 5.0
GHOST = "never-seen"


@dataclass
class Entry:
    session: Session
    token: str
    status: SessionStatus
    last: int
    epoch: int
    detached_at: float = 0.0


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.disposals: dict[int, int] = {}  # id(session object) -> dispose calls
        self.store = SessionStore(
            CAPACITY, TTL, clock=self.clock, on_dispose=self._record, retry_after_s=1.0
        )
        self.model: dict[str, Entry] = {}
        self.detach_order: OrderedDict[str, None] = OrderedDict()
        self.created: list[Session] = []  # every session object the store handed out
        self.removed: set[int] = set()  # id() of session objects the model says are gone
        self.ids: list[str] = [GHOST]

    def _record(self, session: Session) -> None:
        self.disposals[id(session)] = self.disposals.get(id(session), 0) + 1

    # Model helpers.

    def _drop(self, sid: str) -> None:
        entry = self.model.pop(sid)
        self.detach_order.pop(sid, None)
        self.removed.add(id(entry.session))

    def _expired(self, entry: Entry) -> bool:
        return entry.status is SessionStatus.DETACHED and self.clock.now - entry.detached_at >= TTL

    def _live(self, sid: str) -> Entry | None:
        """The model's view of store._live: gone, or expired (removed on the way)."""
        entry = self.model.get(sid)
        if entry is not None and self._expired(entry):
            self._drop(sid)
            return None
        return entry

    def _pick(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(self.ids), label="session_id")

    # Rules.

    @rule()
    def open_new(self) -> None:
        if len(self.model) >= CAPACITY and not self.detach_order:
            try:
                self.store.open_block(None, 0, config=SessionConfig())
            except AtCapacity as exc:
                assert exc.capacity == CAPACITY
                return
            raise AssertionError("a full store of active sessions admitted a new one")
        victim = next(iter(self.detach_order)) if len(self.model) >= CAPACITY else None
        decision = self.store.open_block(None, 0, config=SessionConfig())
        if victim is not None:
            self._drop(victim)
        assert decision.kind is BlockKind.NEW_SESSION and decision.token is not None
        session = decision.session
        self.created.append(session)
        self.ids.append(session.id)
        self.model[session.id] = Entry(session, decision.token, SessionStatus.ACTIVE, 0, 0)

    @rule(data=st.data(), delta=st.sampled_from([0, -1, 1, 2, -2]))
    def chunk(self, data: st.DataObject, delta: int) -> None:
        sid = self._pick(data)
        before = len(self.store)
        entry = self._live(sid)
        block_idx = max(-1, (entry.last if entry else 1) + delta)
        if data.draw(st.booleans(), label="block zero"):
            block_idx = 0
        if entry is None:
            try:
                self.store.open_block(sid, block_idx)
            except SessionStateMissing:
                assert len(self.store) <= before  # nothing fabricated
                return
            raise AssertionError(f"fabricated state for {sid} at block {block_idx}")
        if entry.status is SessionStatus.DETACHED:
            try:
                self.store.open_block(sid, block_idx)
            except IllegalTransition:
                return
            raise AssertionError("a detached session accepted a block")
        if block_idx == 0:
            decision = self.store.open_block(sid, 0)
            assert decision.kind is BlockKind.NEW_EPOCH
            assert decision.session.epoch == entry.epoch + 1
            self.removed.add(id(entry.session))
            self.created.append(decision.session)
            self.model[sid] = Entry(
                decision.session, entry.token, SessionStatus.ACTIVE, 0, entry.epoch + 1
            )
        elif block_idx in (entry.last, entry.last + 1):
            decision = self.store.open_block(sid, block_idx)
            assert decision.retransmit == (block_idx == entry.last)
            assert decision.session is entry.session and decision.epoch == entry.epoch
            entry.last = block_idx
        else:
            try:
                self.store.open_block(sid, block_idx)
            except StaleBlock as exc:
                assert (exc.got, exc.last) == (block_idx, entry.last)
                return
            raise AssertionError(f"stale block {block_idx} accepted after {entry.last}")

    @rule(data=st.data())
    def detach(self, data: st.DataObject) -> None:
        sid = self._pick(data)
        entry = self._live(sid)
        try:
            self.store.detach(sid)
        except SessionStateMissing:
            assert entry is None
            return
        except IllegalTransition:
            assert entry is not None and entry.status is SessionStatus.DETACHED
            return
        assert entry is not None and entry.status is SessionStatus.ACTIVE
        entry.status, entry.detached_at = SessionStatus.DETACHED, self.clock.now
        self.detach_order[sid] = None

    @rule(data=st.data(), right_token=st.booleans())
    def resume(self, data: st.DataObject, right_token: bool) -> None:
        sid = self._pick(data)
        entry = self._live(sid)
        token = entry.token if (entry and right_token) else "wrong-token"
        try:
            self.store.resume(sid, token)
        except SessionStateMissing:
            assert entry is None
            return
        except BadToken:
            assert entry is not None and not right_token
            return
        except IllegalTransition:
            assert entry is not None and entry.status is SessionStatus.ACTIVE
            return
        assert entry is not None and entry.status is SessionStatus.DETACHED and right_token
        entry.status = SessionStatus.ACTIVE
        del self.detach_order[sid]

    @rule()
    def evict(self) -> None:
        victim = next(iter(self.detach_order), None)
        evicted = self.store.evict_one()
        assert (evicted.id if evicted else None) == victim
        if victim is not None:
            self._drop(victim)

    @rule(seconds=st.sampled_from([0.5, 2.0, 5.0, 10.0]))
    def expire(self, seconds: float) -> None:
        self.clock.advance(seconds)
        expected = [sid for sid in self.detach_order if self._expired(self.model[sid])]
        assert self.store.reap() == expected
        for sid in expected:
            self._drop(sid)

    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        sid = self._pick(data)
        assert self.store.close(sid) == (sid in self.model)
        if sid in self.model:
            self._drop(sid)

    # Invariants.

    @invariant()
    def never_over_capacity(self) -> None:
        assert len(self.store) <= CAPACITY

    @invariant()
    def store_matches_model(self) -> None:
        assert {s.id for s in self.store} == set(self.model)
        for sid, entry in self.model.items():
            session = self.store.peek(sid) or entry.session
            assert session is entry.session
            assert session.status is entry.status
            assert (session.last_block_idx, session.epoch) == (entry.last, entry.epoch)
        assert self.store.detached_count == len(self.detach_order)

    @invariant()
    def every_removed_session_disposed_exactly_once(self) -> None:
        for session in self.created:
            expected = 1 if id(session) in self.removed else 0
            assert self.disposals.get(id(session), 0) == expected, session
            if expected:
                assert session.status is SessionStatus.CLOSED


StoreMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_store_rules = StoreMachine.TestCase
