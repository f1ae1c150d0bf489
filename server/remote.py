"""The shared session directory as a worker's core sees it.

server/cluster/ implements it (``WorkerAgent`` is the ``Remote``; ``Directory`` raises these
errors); the core declares here what it calls and what it answers, so it names nothing of
the cluster: the ``Remote`` protocol the service calls in multi-worker mode, the errors the
service and the transports answer, and the directory's default TTLs the settings carry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

from worldserve.protocol import ErrorCode
from worldserve.session.errors import SessionError

if TYPE_CHECKING:
    from worldserve.protocol import Resume
    from worldserve.session.handoff import Handoff

# Seconds an orphaned session record is kept. An orphan is only resumable while its last
# checkpoint lasts (the workers' ``snapshot_ttl_s``, 600 s by default), so this outlives
# it with room to spare.
ORPHAN_TTL_S = 1800.0

# Seconds a handed-over (``migrating``) session holds its slot on the target worker before
# its client resumes there. The client is, meanwhile, detached: this is the workers'
# default ``detached_ttl_s``, the time a worker keeps a detached session of its own. A
# client that follows ``migrate`` at once resumes well within it.
HANDOVER_TTL_S = 30.0


class DirectoryError(Exception):
    """Base of the directory's errors; ``code`` is stable and goes on the wire."""

    code: ClassVar[str] = "directory_error"


class DirectoryUnavailable(DirectoryError):
    """The backing store cannot be reached or answered wrongly: refuse, never guess."""

    code = "directory_unavailable"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"session directory unavailable: {reason}")


class PlacementRequired(Exception):
    """Multi-worker mode: a ``start`` without a reservation this worker holds."""

    code = ErrorCode.PLACEMENT_REQUIRED


class SessionMoved(SessionError):
    """A resume at a worker that does not hold the session: ask the router where it is."""

    code = ErrorCode.SESSION_MOVED

    def __init__(self, session_id: str, worker_id: str) -> None:
        self.session_id = session_id
        super().__init__(
            f"session {session_id!r} is on worker {worker_id!r}, not this one: ask the "
            f"router (POST /v1/resume) where to resume it"
        )


class Remote(Protocol):
    """The shared session directory as the service sees it (server/cluster/agent.py's
    ``WorkerAgent``); absent in the embedded single-worker mode."""

    def unhealthy(self) -> str | None:
        """Why new sessions cannot be taken now (e.g. the directory is down), or None."""
        ...

    async def admit(self, reservation: str | None) -> None:
        """Check a ``start``'s reservation; raises PlacementRequired or DirectoryError."""
        ...

    async def authorize(self, session_id: str, token: str) -> None:
        """Check a resume's token against the directory's record of the session, before
        any hand-off is fetched; raises BadToken, SessionMoved or DirectoryError (nothing
        happens when the directory has no record, or none of its token)."""
        ...

    async def fetch(self, session_id: str, token: str | None = None) -> Handoff | None:
        """The handoff of a session placed on this worker (None: no record at all);
        raises SessionMoved, SessionStateMissing (no snapshot) or DirectoryError, and,
        given a token, BadToken before fetching when the record's token hash differs."""
        ...

    async def adopt(self, msg: Resume) -> None:
        """Before a resume: a session this worker does not hold but the directory placed
        here is installed from its handoff (nothing happens when the directory has no record
        of it); raises SessionMoved, SessionStateMissing (no usable snapshot), BadToken or
        DirectoryError."""
        ...

    def opened(self, session_id: str, epoch: int) -> None: ...

    def resumed(self, session_id: str, epoch: int, next_block: int) -> None: ...

    def ended(self, session_id: str, reason: str) -> None: ...
