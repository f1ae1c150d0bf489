"""Typed errors of the session layer.

Every error carries a stable ``code`` (a class attribute) that the server puts on the
wire, and the values it names as attributes, so a handler never parses messages. The
codes a client can receive are the protocol's (``protocol.ErrorCode``).
"""

from __future__ import annotations

from typing import ClassVar

from worldserve.protocol.messages import ErrorCode


class SessionError(Exception):
    """Base of every session-layer error."""

    code: ClassVar[str] = "session_error"


class SessionStateMissing(SessionError):
    """The session is unknown, expired, evicted or closed: its state is gone.

    The store never fabricates a session for ``block_idx > 0``; the client must open a
    new session at ``block_idx == 0``.
    """

    code = ErrorCode.MISSING_SESSION_STATE

    def __init__(self, session_id: str | None, block_idx: int | None = None) -> None:
        self.session_id = session_id
        self.block_idx = block_idx
        at = "" if block_idx is None else f" at block_idx {block_idx}"
        super().__init__(
            f"missing session state for session {session_id!r}{at}: unknown, expired or "
            "evicted; open a new session with block_idx 0"
        )


class StaleBlock(SessionError):
    """A block_idx that is neither the next one nor a retransmit of the last one."""

    code = ErrorCode.STALE_BLOCK

    def __init__(self, session_id: str, got: int, last: int) -> None:
        self.session_id = session_id
        self.got = got
        self.last = last
        super().__init__(
            f"stale block_idx {got} for session {session_id!r}: the last block_idx is "
            f"{last}, so expected {last} (retransmit), {last + 1} (next) or 0 (new epoch)"
        )


class AtCapacity(SessionError):
    """The store is full of active sessions; nothing can be evicted to make room."""

    code = ErrorCode.AT_CAPACITY

    def __init__(self, capacity: int, retry_after_s: float) -> None:
        self.capacity = capacity
        self.retry_after_s = retry_after_s
        super().__init__(
            f"at capacity: {capacity} sessions, none evictable; retry after {retry_after_s:g} s"
        )


class IllegalTransition(SessionError):
    """An action that the session's current status does not allow."""

    code = ErrorCode.ILLEGAL_TRANSITION

    def __init__(self, session_id: str, from_status: str, action: str) -> None:
        self.session_id = session_id
        self.from_status = from_status
        self.action = action
        super().__init__(f"cannot {action} session {session_id!r} while it is {from_status}")


class BadToken(SessionError):
    """A resume token that does not match the session's (the token is never echoed)."""

    code = ErrorCode.BAD_TOKEN

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"bad resume token for session {session_id!r}")


class SnapshotError(SessionError):
    """A snapshot that cannot be restored: malformed, truncated, too big or a bad version."""

    code = "bad_snapshot"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"bad snapshot: {reason}")
