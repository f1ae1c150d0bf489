"""The session directory that workers and a router share: its records, errors and contract.

Workers register themselves and heartbeat their load; a router places each new session on
the least-loaded serving worker; a draining worker leaves snapshots here for the next one.
Two implementations keep the same contract: ``MemoryDirectory`` (one process, the embedded
default) and ``RedisDirectory`` (many workers and routers).

Rules both keep:
- A worker's record carries its process's ``instance``: a worker that restarts within its
  TTL registers with a new one, and the sessions its old record held are orphaned at once
  (they no longer hold slots, and a ``start`` naming one of their ids finds nothing to claim).
- A worker is live while its heartbeat TTL lasts. Its record outlives the TTL until
  ``reap_dead_workers`` (or ``deregister_worker``) removes it and orphans its sessions; a
  heartbeat from a reaped worker raises ``UnknownWorker`` so it re-registers.
- A worker's effective load is ``max(reported load, sessions placed on it)``. Placement
  counts its own reservations at once, so a heartbeat that has not yet seen a session that
  is on its way cannot give its slot away twice.
- A session holds a slot on its worker while it is ``active``, ``migrating`` or
  ``reserved``; an ``orphaned`` one holds none. It moves to another worker only through ``place_session``,
  which keeps its epoch and next block_idx.
- A session handed over (written ``migrating`` while its worker is registered: a draining
  worker's target, or a router's re-placement) holds that slot for ``handover_ttl_s``
  after that write (a constructor argument of both implementations). If no other write
  reaches it by then (the target writes it ``active`` once its client resumes there), it
  becomes ``orphaned``: it leaves the worker's sessions, so it no longer counts toward the
  worker's load, and its record lapses like any orphan's. Its client can still resume
  through a new placement while the handoff snapshot lasts.
- A reservation (``place_session`` with ``reserve_s``: a router's answer to a new client) is
  written ``reserved`` and holds its slot for ``reserve_s``. ``claim_reservation`` by the
  worker it is on turns it ``active`` once, and only once (a second ``start`` with the same
  id finds it taken); one nobody claims in time is deleted and gives its slot back.
- A session record whose worker is gone (``orphaned``, or written while its worker is not
  registered) lapses ``orphan_ttl_s`` after it became so (a constructor argument of both
  implementations), so dead workers' sessions do not pile up. ``place_session``, or an
  ``update_session`` to active or migrating while its worker is registered, keeps it
  again. Active and migrating records on registered workers do not lapse (a handover that
  ran out is orphaned first): ``release_session`` removes them.
- The errors' base ``DirectoryError``, ``DirectoryUnavailable`` and the default TTLs
  (``ORPHAN_TTL_S``, ``HANDOVER_TTL_S``) live in server/remote.py: the worker's core answers
  and configures them without naming the cluster.
- Times are the directory's clock readings (wall clock by default: records are read on
  other machines). TTLs are counted by the backing store: by that clock in memory, by Redis
  itself in Redis.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from worldserve.server.remote import DirectoryError

Clock = Callable[[], float]

MAX_ID_CHARS = 128

class WorkerState(StrEnum):
    STARTING = "starting"  # registered, still loading: gets no sessions
    SERVING = "serving"  # admits new sessions
    DRAINING = "draining"  # handing its sessions over: gets no new ones


class SessionState(StrEnum):
    ACTIVE = "active"  # on its worker
    MIGRATING = "migrating"  # handed over, waiting (handover_ttl_s at most) for the client to resume
    ORPHANED = "orphaned"  # its worker died or its handover ran out; resume from the snapshot
    RESERVED = "reserved"  # placed by a router for a new session, waiting for its one start


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    worker_id: str
    address: str  # http base URL, e.g. "http://10.0.0.7:8000"
    state: WorkerState = WorkerState.STARTING
    capacity: int = 1  # sessions it can serve at once
    load: int = 0  # active sessions (effective load when read back)
    utilisation: float = 0.0  # compute busy fraction, 0..1 (may exceed 1 when overloaded)
    heartbeat: float = 0.0  # clock reading of the last register or heartbeat
    # random per worker process: registering with another instance than the record's (a
    # restart within the TTL) orphans the sessions the record still holds
    instance: str = ""
    # HMAC-SHA256 hex of worker_id, address and instance with the cluster secret ("" with
    # none): routers place only on workers whose signature checks (server/cluster/signing.py)
    signature: str = ""

    def __post_init__(self) -> None:
        _check_id("worker_id", self.worker_id)
        if not isinstance(self.address, str) or not self.address:
            raise ValueError(f"address must be a non-empty str, got {self.address!r}")
        WorkerState(self.state)  # ValueError naming the bad value
        _check_count("capacity", self.capacity)
        _check_count("load", self.load)
        _check_utilisation(self.utilisation)


@dataclass(frozen=True, slots=True)
class SessionRecord:
    session_id: str
    worker_id: str  # the worker that holds (or last held) it
    epoch: int = 0
    block_idx: int = 0  # the next block_idx the session expects
    state: SessionState = SessionState.ACTIVE
    updated: float = 0.0  # clock reading of the last write; set by the directory
    # SHA-256 hex of the session's resume token ("" unknown; a write with "" keeps the
    # stored one): a worker checks a resume against it before it fetches a hand-off
    token_hash: str = ""

    def __post_init__(self) -> None:
        _check_id("session_id", self.session_id)
        if self.token_hash and not _TOKEN_HASH.fullmatch(self.token_hash):
            raise ValueError("token_hash must be 64 lowercase hex digits or empty")
        _check_id("worker_id", self.worker_id)
        SessionState(self.state)
        _check_count("epoch", self.epoch)
        _check_count("block_idx", self.block_idx)


_TOKEN_HASH = re.compile(r"[0-9a-f]{64}")


class NoWorkerAvailable(DirectoryError):
    """No live serving worker has a free slot below the utilisation threshold."""

    code = "no_worker_available"

    def __init__(self, retry_after_s: float, live: int = 0, serving: int = 0) -> None:
        self.retry_after_s = retry_after_s
        self.live = live
        self.serving = serving
        super().__init__(
            f"no worker available: {live} live, {serving} serving, none with a free slot "
            f"below the threshold; retry after {retry_after_s:g} s"
        )


class UnknownWorker(DirectoryError):
    """The worker is not registered (never was, deregistered, or reaped after its TTL)."""

    code = "unknown_worker"

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        super().__init__(f"unknown worker {worker_id!r}: register it (again)")


class UnknownSession(DirectoryError):
    """No record for the session."""

    code = "unknown_session"

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"unknown session {session_id!r}")


class Directory(Protocol):
    """What workers and routers share. Every method may raise ``DirectoryUnavailable``."""

    async def register_worker(self, info: WorkerInfo, ttl_s: float) -> None:
        """Add or replace a worker's record and start its TTL. Its placed sessions stay when
        ``info.instance`` is the record's, else they are orphaned."""
        ...

    async def heartbeat(
        self,
        worker_id: str,
        load: int,
        utilisation: float,
        state: WorkerState,
        ttl_s: float,
    ) -> None:
        """Report load and state and renew the TTL; ``UnknownWorker`` once it was reaped."""
        ...

    async def set_worker_state(self, worker_id: str, state: WorkerState) -> None:
        """``UnknownWorker`` if it is not registered."""
        ...

    async def deregister_worker(self, worker_id: str) -> list[str]:
        """Remove the worker; returns the ids of its sessions, now orphaned."""
        ...

    async def get_worker(self, worker_id: str) -> WorkerInfo | None:
        """The live worker's record (effective load), or None."""
        ...

    async def list_workers(self) -> list[WorkerInfo]:
        """Live workers only, by worker_id, with their effective load."""
        ...

    async def place_session(
        self, session_id: str, threshold: float, *, reserve_s: float | None = None,
        among: Collection[str] | None = None,
    ) -> WorkerInfo:
        """Atomically pick the serving worker with the lowest load / capacity (then the
        lowest utilisation, then the lowest id) among those with load < capacity and
        utilisation < threshold (and, given ``among``, whose id is in it), take a slot on
        it and record the session there as active, or, with ``reserve_s``, as reserved
        for that many seconds. A known session moves (its old slot is freed; epoch and
        block_idx stay). Returns the worker with its new load; ``NoWorkerAvailable`` if
        there is none."""
        ...

    async def claim_reservation(self, session_id: str, worker_id: str) -> bool:
        """Turn the session's reservation on ``worker_id`` active; False when there is
        none to claim (unknown, on another worker, lapsed, or claimed already)."""
        ...

    async def release_session(self, session_id: str) -> bool:
        """Forget the session and free its slot; False if it was unknown."""
        ...

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The record, or None (never placed, released, or lapsed after its worker went)."""
        ...

    async def update_session(self, record: SessionRecord) -> SessionRecord:
        """Write epoch, block_idx and state (``updated`` is stamped); returns what was
        stored. ``UnknownSession`` if it has no record; ``ValueError`` if
        ``record.worker_id`` is not its worker (sessions move through place_session).
        ``migrating`` on a registered worker starts the ``handover_ttl_s`` countdown;
        any other write stops it."""
        ...

    async def recreate_session(self, record: SessionRecord) -> bool:
        """Write the record of a session its worker still runs but the directory lost
        (evicted, flushed, restored from an old dump): active on ``record.worker_id``,
        holding a slot there while it is registered (else lapsing like an orphan's). False,
        writing nothing, when the session has a record."""
        ...

    async def put_snapshot(self, session_id: str, data: bytes, ttl_s: float) -> None: ...

    async def get_snapshot(self, session_id: str) -> bytes | None: ...

    async def delete_snapshot(self, session_id: str) -> bool: ...

    async def orphan_sessions_of(self, worker_id: str) -> list[str]:
        """Mark every session on the worker orphaned (they free their slots and their
        records lapse after ``orphan_ttl_s``); returns their ids. For dead workers: a
        live worker would be overbooked."""
        ...

    async def reap_dead_workers(self) -> dict[str, list[str]]:
        """Remove every worker whose TTL lapsed and orphan its sessions; returns
        worker_id -> orphaned session ids. Also orphans every handed-over session whose
        ``handover_ttl_s`` ran out (routers call this periodically)."""
        ...

    async def close(self) -> None: ...


def check_ttl(ttl_s: float, name: str = "ttl_s") -> None:
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float):
        raise ValueError(f"{name} must be a number of seconds, got {ttl_s!r}")
    if not math.isfinite(ttl_s) or ttl_s <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {ttl_s!r}")


def check_heartbeat(load: int, utilisation: float, state: WorkerState, ttl_s: float) -> None:
    _check_count("load", load)
    _check_utilisation(utilisation)
    WorkerState(state)
    check_ttl(ttl_s)


def check_threshold(threshold: float) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise ValueError(f"threshold must be a number, got {threshold!r}")
    if not math.isfinite(threshold) or threshold <= 0:
        raise ValueError(f"threshold must be finite and > 0, got {threshold!r}")


def _check_id(name: str, value: str) -> None:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ID_CHARS:
        raise ValueError(f"{name} must be a str of 1 to {MAX_ID_CHARS} chars, got {value!r:.140}")


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def _check_utilisation(value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"utilisation must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"utilisation must be finite and >= 0, got {value!r}")
