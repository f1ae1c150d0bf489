"""The session store: an LRU of sessions with block_idx epochs, a TTL and a capacity.

Rules (as in SGLang's realtime session cache):

- ``open_block(id, 0)`` starts a new epoch: the old state of ``id`` is disposed and a new
  ``Session`` (same id and token, ``epoch + 1``) installed. ``open_block(None, 0,
  config=...)`` creates a new session with a fresh id and token.
- ``open_block(id, n > 0)`` for an id with no state (never seen, expired, evicted,
  closed) raises ``SessionStateMissing``: the store never fabricates a session.
- ``n == last`` is an idempotent retransmit (``BlockDecision.retransmit``, no new work);
  ``n == last + 1`` is the next block; anything else raises ``StaleBlock``. A
  retransmitted block 0 cannot be told from a restart: it opens another epoch.
- Capacity counts every session. ACTIVE sessions are never evicted: when the store is
  full, the least recently detached session is evicted, and with none to evict a new
  session is refused with ``AtCapacity`` (carrying retry-after).
- DETACHED sessions stay resumable (``resume(id, token)``) for ``detached_ttl_s``; after
  that they are gone, whether or not ``reap`` has run yet.
- Every removal (close, new epoch, eviction, expiry, ``clear``) closes the session and
  runs ``on_dispose(session)`` exactly once. A failing hook is logged with the session id
  and swallowed; the entry is already gone, so the store stays consistent.

Threading: single-threaded by design, owned by the asyncio loop thread. No method awaits
or blocks and every lookup is O(1) (eviction and reaping pop from the front of the
detached order), so the loop calls it inline. ``on_dispose`` runs inline too: it must
not block (hand teardown of model state to the scheduler's next plan instead). It may
call back into the store.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum

from worldserve.session.errors import AtCapacity, BadToken, IllegalTransition, SessionStateMissing
from worldserve.session.eventlog import DEFAULT_CAPACITY, DEFAULT_FRAME_BYTES
from worldserve.session.session import Clock, Session, SessionConfig, SessionStatus

logger = logging.getLogger(__name__)


class BlockKind(StrEnum):
    NEW_SESSION = "new_session"  # block 0 of a session created by this call
    NEW_EPOCH = "new_epoch"  # block 0 on an existing session: old state disposed
    NEXT = "next"  # last + 1: generate it
    RETRANSMIT = "retransmit"  # == last: resend what that block produced, no new work


@dataclass(frozen=True, slots=True)
class BlockDecision:
    """What ``SessionStore.open_block`` decided for one block request."""

    session: Session
    block_idx: int
    epoch: int
    kind: BlockKind
    token: str | None = field(default=None, repr=False)  # new resume token; NEW_SESSION only

    @property
    def session_id(self) -> str:
        return self.session.id

    @property
    def retransmit(self) -> bool:
        return self.kind is BlockKind.RETRANSMIT

    @property
    def new_epoch(self) -> bool:
        return self.kind in (BlockKind.NEW_SESSION, BlockKind.NEW_EPOCH)


class SessionStore:
    """Sessions by id, least recently used first. See the module docstring for the rules."""

    def __init__(
        self,
        capacity: int,
        detached_ttl_s: float,
        *,
        clock: Clock = time.monotonic,
        on_dispose: Callable[[Session], object] | None = None,
        retry_after_s: float = 1.0,
        log_capacity: int = DEFAULT_CAPACITY,
        log_frame_bytes: int = DEFAULT_FRAME_BYTES,
        max_token_age_s: float = math.inf,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        if not (math.isfinite(detached_ttl_s) and detached_ttl_s >= 0):
            raise ValueError(f"detached_ttl_s must be finite and >= 0, got {detached_ttl_s!r}")
        if not (math.isfinite(retry_after_s) and retry_after_s > 0):
            raise ValueError(f"retry_after_s must be finite and > 0, got {retry_after_s!r}")
        self.capacity = capacity
        self.detached_ttl_s = detached_ttl_s
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._on_dispose = on_dispose
        self._log_capacity = log_capacity
        self._log_frame_bytes = log_frame_bytes
        self.max_token_age_s = max_token_age_s  # a resume token older than this is refused
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first
        self._detached: OrderedDict[str, Session] = OrderedDict()  # oldest detach first
        # Counters for metrics.
        self.evicted = 0
        self.expired = 0
        self.dispose_failures = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def __iter__(self) -> Iterator[Session]:
        """Sessions, least recently used first. Do not add or remove while iterating."""
        return iter(self._sessions.values())

    @property
    def detached_count(self) -> int:
        return len(self._detached)

    @property
    def active_count(self) -> int:
        return len(self._sessions) - len(self._detached)

    # Lookups.

    def peek(self, session_id: str) -> Session | None:
        """The live session with this id, or None; no side effects."""
        session = self._sessions.get(session_id)
        if (
            session is None
            or session.status is SessionStatus.CLOSED
            or self._is_expired(session, self._clock())
        ):
            return None
        return session

    def get(self, session_id: str) -> Session:
        """The live session with this id, marked used; SessionStateMissing if none."""
        session = self._live(session_id, None)
        self._sessions.move_to_end(session_id)
        session.touch()
        return session

    # Blocks.

    def open_block(
        self,
        session_id: str | None,
        block_idx: int,
        *,
        config: SessionConfig | None = None,
        scene: str | None = None,
        frames: int = 1,
    ) -> BlockDecision:
        """Apply the block_idx rules to one block request (see the module docstring).

        ``config`` and ``scene`` matter for block 0 only: required / "" for a new
        session, defaulting to the old epoch's values for a new epoch. ``frames`` is the
        chunk's frame count, added to ``frames_due`` for a new block.
        """
        if session_id is None:
            if block_idx != 0:
                raise SessionStateMissing(None, block_idx)
            if config is None:
                raise ValueError("a new session needs a config")
            session, token = Session.create(
                config, scene=scene or "", clock=self._clock, log_capacity=self._log_capacity,
                log_frame_bytes=self._log_frame_bytes,
            )
            if session.id in self._sessions:  # 96 random bits: never in practice
                raise RuntimeError(f"session id collision on {session.id!r}")
            session.accept_block(0, frames)
            self._make_room()
            self._sessions[session.id] = session
            return BlockDecision(session, 0, session.epoch, BlockKind.NEW_SESSION, token)

        old = self._live(session_id, block_idx)
        if block_idx == 0:
            if old.status is not SessionStatus.ACTIVE:
                raise IllegalTransition(session_id, old.status.value, "open a new epoch of")
            session = Session(
                config or old.config,
                old.token_hash,
                session_id=session_id,
                scene=old.scene if scene is None else scene,
                epoch=old.epoch + 1,
                clock=self._clock,
                log_capacity=self._log_capacity,
                log_frame_bytes=self._log_frame_bytes,
            )
            session.accept_block(0, frames)
            self._sessions[session_id] = session
            self._sessions.move_to_end(session_id)
            self._dispose(old, "new epoch")
            return BlockDecision(session, 0, session.epoch, BlockKind.NEW_EPOCH)

        fresh = old.accept_block(block_idx, frames)
        self._sessions.move_to_end(session_id)
        old.touch()
        kind = BlockKind.NEXT if fresh else BlockKind.RETRANSMIT
        return BlockDecision(old, block_idx, old.epoch, kind)

    def commit_block(self, session_id: str, block_idx: int, frames: int = 1) -> Session:
        """The runner finished ``block_idx`` of this session (see ``Session.commit_block``)."""
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionStateMissing(session_id, block_idx)
        session.commit_block(block_idx, frames)
        return session

    # Attachment.

    def detach(self, session_id: str) -> Session:
        """ACTIVE → DETACHED: the client went away; resumable until the TTL runs out."""
        session = self._live(session_id, None)
        session.detach()
        self._detached[session_id] = session
        self._sessions.move_to_end(session_id)
        return session

    def resume(self, session_id: str, token: str) -> Session:
        """DETACHED → ACTIVE with the session's token. BadToken on a wrong token (checked
        first, so a caller without the token learns nothing), IllegalTransition while
        another client is attached (detach that one first)."""
        session = self._live(session_id, None)
        if not session.check_token(token, self.max_token_age_s):
            raise BadToken(session_id)
        session.attach()
        del self._detached[session_id]
        self._sessions.move_to_end(session_id)
        return session

    def install(self, session: Session) -> None:
        """Add a session built elsewhere (a restored snapshot, usually DETACHED), under
        the same capacity rules as a new one. ValueError if the id is taken."""
        if session.status is SessionStatus.CLOSED:
            raise ValueError(f"cannot install closed session {session.id!r}")
        if session.id in self._sessions:
            raise ValueError(f"session {session.id!r} is already in the store")
        self._make_room()
        self._sessions[session.id] = session
        if session.status is SessionStatus.DETACHED:
            self._detached[session.id] = session

    # Removal.

    def close(self, session_id: str) -> bool:
        """Remove and dispose a session; False if it was not there."""
        session = self._sessions.get(session_id)
        if session is None:
            return False
        self._remove(session, "close")
        return True

    def evict_one(self) -> Session | None:
        """Evict the least recently detached session, if any; active ones are never evicted."""
        if not self._detached:
            return None
        session = next(iter(self._detached.values()))
        self.evicted += 1
        self._remove(session, "evicted")
        return session

    def reap(self, now: float | None = None) -> list[str]:
        """Remove the detached sessions whose TTL ran out; returns their ids."""
        now = self._clock() if now is None else now
        reaped: list[str] = []
        while self._detached:
            session = next(iter(self._detached.values()))
            if not self._is_expired(session, now):
                break
            self.expired += 1
            self._remove(session, "expired")
            reaped.append(session.id)
        return reaped

    def clear(self) -> None:
        """Remove and dispose every session (shutdown)."""
        while self._sessions:
            self._remove(next(iter(self._sessions.values())), "clear")

    # Internals.

    def _is_expired(self, session: Session, now: float) -> bool:
        return (
            session.status is SessionStatus.DETACHED
            and now - session.detached_at >= self.detached_ttl_s
        )

    def _live(self, session_id: str, block_idx: int | None) -> Session:
        """The session, or SessionStateMissing; an expired one is removed on the way."""
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionStateMissing(session_id, block_idx)
        if session.status is SessionStatus.CLOSED:  # closed behind the store's back
            self._remove(session, "closed")
            raise SessionStateMissing(session_id, block_idx)
        if self._is_expired(session, self._clock()):
            self.expired += 1
            self._remove(session, "expired")
            raise SessionStateMissing(session_id, block_idx)
        return session

    def _make_room(self) -> None:
        while len(self._sessions) >= self.capacity:
            if self.evict_one() is None:
                raise AtCapacity(self.capacity, self.retry_after_s)

    def _remove(self, session: Session, reason: str) -> None:
        del self._sessions[session.id]
        self._detached.pop(session.id, None)
        self._dispose(session, reason)

    def _dispose(self, session: Session, reason: str) -> None:
        """Close a session that is no longer in the store and run the hook, once."""
        if session.status is not SessionStatus.CLOSED:
            session.close()
        if self._on_dispose is None:
            return
        try:
            self._on_dispose(session)
        except Exception:
            self.dispose_failures += 1
            logger.exception("dispose hook failed for session %s (%s)", session.id, reason)
