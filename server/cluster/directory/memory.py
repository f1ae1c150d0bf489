"""``MemoryDirectory``: the directory of one process (the embedded default; no Redis).

Plain dicts owned by the event loop. No method awaits anything before it is done, so each
one is atomic with respect to the others, which is what the Redis implementation gets from
Lua. TTLs are deadlines on the injected clock, checked when read; expired snapshots and
lapsed session records are also swept on writes, so ones nobody reads again do not stay.
Handovers that ran out are orphaned before anything reads a session or a worker's load.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection

from worldserve.server.cluster.directory.base import (
    Clock,
    NoWorkerAvailable,
    SessionRecord,
    SessionState,
    UnknownSession,
    UnknownWorker,
    WorkerInfo,
    WorkerState,
    check_heartbeat,
    check_threshold,
    check_ttl,
)
from worldserve.server.remote import HANDOVER_TTL_S, ORPHAN_TTL_S

_HOLDS_SLOT = (SessionState.ACTIVE, SessionState.MIGRATING, SessionState.RESERVED)


@dataclasses.dataclass(slots=True)
class _Worker:
    info: WorkerInfo  # load here is the reported one
    deadline: float  # live while clock() < deadline
    sessions: set[str]  # placed here and holding a slot


class MemoryDirectory:
    def __init__(
        self,
        *,
        clock: Clock = time.time,
        retry_after_s: float = 1.0,
        orphan_ttl_s: float = ORPHAN_TTL_S,
        handover_ttl_s: float = HANDOVER_TTL_S,
    ) -> None:
        check_ttl(orphan_ttl_s, "orphan_ttl_s")
        check_ttl(handover_ttl_s, "handover_ttl_s")
        self._clock = clock
        self._retry_after_s = retry_after_s
        self._orphan_ttl_s = orphan_ttl_s
        self._handover_ttl_s = handover_ttl_s
        self._workers: dict[str, _Worker] = {}
        self._sessions: dict[str, SessionRecord] = {}
        self._lapse: dict[str, float] = {}  # id -> deadline of a record whose worker is gone
        self._handover: dict[str, float] = {}  # id -> deadline of a migrating record's slot
        self._snapshots: dict[str, tuple[bytes, float]] = {}  # id -> (data, deadline)

    # Workers.

    async def register_worker(self, info: WorkerInfo, ttl_s: float) -> None:
        check_ttl(ttl_s)
        old = self._workers.get(info.worker_id)
        if old is not None and old.info.instance != info.instance:  # restarted: its sessions went with it
            await self.orphan_sessions_of(info.worker_id)
        now = self._clock()
        sessions = old.sessions if old is not None else set()
        info = dataclasses.replace(info, heartbeat=now)
        self._workers[info.worker_id] = _Worker(info, now + ttl_s, sessions)

    async def heartbeat(
        self,
        worker_id: str,
        load: int,
        utilisation: float,
        state: WorkerState,
        ttl_s: float,
    ) -> None:
        check_heartbeat(load, utilisation, state, ttl_s)
        w = self._workers.get(worker_id)
        if w is None:
            raise UnknownWorker(worker_id)
        now = self._clock()
        w.info = dataclasses.replace(
            w.info, load=load, utilisation=float(utilisation), state=state, heartbeat=now
        )
        w.deadline = now + ttl_s

    async def set_worker_state(self, worker_id: str, state: WorkerState) -> None:
        w = self._workers.get(worker_id)
        if w is None:
            raise UnknownWorker(worker_id)
        w.info = dataclasses.replace(w.info, state=WorkerState(state))

    async def deregister_worker(self, worker_id: str) -> list[str]:
        orphaned = await self.orphan_sessions_of(worker_id)
        self._workers.pop(worker_id, None)
        return orphaned

    async def get_worker(self, worker_id: str) -> WorkerInfo | None:
        now = self._clock()
        self._expire_handovers(now)
        w = self._workers.get(worker_id)
        if w is None or not now < w.deadline:
            return None
        return self._effective(w)

    async def list_workers(self) -> list[WorkerInfo]:
        now = self._clock()
        self._expire_handovers(now)
        return [
            self._effective(self._workers[wid])
            for wid in sorted(self._workers)
            if now < self._workers[wid].deadline
        ]

    async def reap_dead_workers(self) -> dict[str, list[str]]:
        now = self._clock()
        self._expire_handovers(now)
        dead = sorted(wid for wid, w in self._workers.items() if not now < w.deadline)
        return {wid: await self.deregister_worker(wid) for wid in dead}

    # Sessions.

    async def place_session(
        self, session_id: str, threshold: float, *, reserve_s: float | None = None,
        among: Collection[str] | None = None,
    ) -> WorkerInfo:
        check_threshold(threshold)
        if reserve_s is not None:
            check_ttl(reserve_s, "reserve_s")
        now = self._clock()
        self._expire_handovers(now)
        live = serving = 0
        best: tuple[float, float, str] | None = None
        for wid in sorted(self._workers):
            w = self._workers[wid]
            if not now < w.deadline:
                continue
            live += 1
            if w.info.state != WorkerState.SERVING or (among is not None and wid not in among):
                continue
            serving += 1
            load = self._load(w)
            if load < w.info.capacity and w.info.utilisation < threshold:
                key = (load / w.info.capacity, w.info.utilisation, wid)
                best = key if best is None or key < best else best
        if best is None:
            raise NoWorkerAvailable(self._retry_after_s, live, serving)
        worker = self._workers[best[2]]
        self._sweep(now)
        old = self._sessions.get(session_id)
        if old is not None and old.worker_id in self._workers:
            self._workers[old.worker_id].sessions.discard(session_id)
        worker.sessions.add(session_id)
        self._sessions[session_id] = SessionRecord(
            session_id,
            worker.info.worker_id,
            epoch=old.epoch if old is not None else 0,
            block_idx=old.block_idx if old is not None else 0,
            state=SessionState.ACTIVE if reserve_s is None else SessionState.RESERVED,
            updated=now,
            token_hash=old.token_hash if old is not None else "",
        )
        self._lapse.pop(session_id, None)
        self._handover.pop(session_id, None)
        if reserve_s is not None:  # held like a handover, deleted if nobody claims it
            self._handover[session_id] = now + reserve_s
        return self._effective(worker)

    async def claim_reservation(self, session_id: str, worker_id: str) -> bool:
        record = self._record(session_id)
        if record is None or record.worker_id != worker_id or record.state is not SessionState.RESERVED:
            return False
        self._sessions[session_id] = dataclasses.replace(record, state=SessionState.ACTIVE, updated=self._clock())
        self._handover.pop(session_id, None)
        return True

    async def release_session(self, session_id: str) -> bool:
        if self._record(session_id) is None:
            return False
        record = self._sessions.pop(session_id)
        self._lapse.pop(session_id, None)
        self._handover.pop(session_id, None)
        if record.worker_id in self._workers:
            self._workers[record.worker_id].sessions.discard(session_id)
        return True

    async def get_session(self, session_id: str) -> SessionRecord | None:
        return self._record(session_id)

    async def update_session(self, record: SessionRecord) -> SessionRecord:
        now = self._clock()
        self._expire_handovers(now)
        self._sweep(now)
        old = self._sessions.get(record.session_id)
        if old is None:
            raise UnknownSession(record.session_id)
        if record.worker_id != old.worker_id:
            raise ValueError(
                f"session {record.session_id!r} is on worker {old.worker_id!r}, not "
                f"{record.worker_id!r}: move it with place_session"
            )
        stored = dataclasses.replace(record, updated=now, token_hash=record.token_hash or old.token_hash)
        self._sessions[record.session_id] = stored
        w = self._workers.get(record.worker_id)
        if w is not None and stored.state in _HOLDS_SLOT:
            w.sessions.add(record.session_id)
            self._lapse.pop(record.session_id, None)
            if stored.state is SessionState.MIGRATING:  # handed over: held for a while
                self._handover[record.session_id] = now + self._handover_ttl_s
            else:
                self._handover.pop(record.session_id, None)
        else:  # orphaned, or its worker is gone: the record lapses
            if w is not None:
                w.sessions.discard(record.session_id)
            self._lapse[record.session_id] = now + self._orphan_ttl_s
            self._handover.pop(record.session_id, None)
        return stored

    async def recreate_session(self, record: SessionRecord) -> bool:
        if self._record(record.session_id) is not None:
            return False
        now = self._clock()
        self._sessions[record.session_id] = dataclasses.replace(record, state=SessionState.ACTIVE, updated=now)
        w = self._workers.get(record.worker_id)
        if w is not None:
            w.sessions.add(record.session_id)
        else:
            self._lapse[record.session_id] = now + self._orphan_ttl_s
        return True

    async def orphan_sessions_of(self, worker_id: str) -> list[str]:
        now = self._clock()
        self._expire_handovers(now)
        self._sweep(now)
        orphaned = []
        for sid, record in self._sessions.items():
            if record.worker_id == worker_id and record.state in _HOLDS_SLOT:
                self._sessions[sid] = dataclasses.replace(
                    record, state=SessionState.ORPHANED, updated=now
                )
                self._lapse[sid] = now + self._orphan_ttl_s
                self._handover.pop(sid, None)
                orphaned.append(sid)
        if worker_id in self._workers:
            self._workers[worker_id].sessions.clear()
        return sorted(orphaned)

    # Snapshots.

    async def put_snapshot(self, session_id: str, data: bytes, ttl_s: float) -> None:
        check_ttl(ttl_s)
        now = self._clock()
        # Expired snapshots nobody reads again would stay forever: sweep them here.
        for sid in [sid for sid, (_, deadline) in self._snapshots.items() if not now < deadline]:
            del self._snapshots[sid]
        self._snapshots[session_id] = (bytes(data), now + ttl_s)

    async def get_snapshot(self, session_id: str) -> bytes | None:
        entry = self._snapshots.get(session_id)
        if entry is None:
            return None
        if not self._clock() < entry[1]:
            del self._snapshots[session_id]
            return None
        return entry[0]

    async def delete_snapshot(self, session_id: str) -> bool:
        if await self.get_snapshot(session_id) is None:
            return False
        del self._snapshots[session_id]
        return True

    async def close(self) -> None:
        """Nothing to release; the records go with the process."""

    # Helpers.

    def _record(self, session_id: str) -> SessionRecord | None:
        """The session's record, unless it lapsed (then it is dropped)."""
        now = self._clock()
        self._expire_handovers(now)
        deadline = self._lapse.get(session_id)
        if deadline is not None and not now < deadline:
            del self._lapse[session_id]
            del self._sessions[session_id]
            return None
        return self._sessions.get(session_id)

    def _sweep(self, now: float) -> None:
        """Drop every lapsed session record."""
        for sid in [sid for sid, deadline in self._lapse.items() if not now < deadline]:
            del self._lapse[sid]
            del self._sessions[sid]

    def _expire_handovers(self, now: float) -> None:
        """Orphan every handed-over session whose client did not resume in time: it gives
        its worker's slot back and its record lapses like any orphan's. A reservation
        nobody claimed in time is deleted."""
        for sid in [sid for sid, deadline in self._handover.items() if not now < deadline]:
            del self._handover[sid]
            record = self._sessions.get(sid)
            if record is not None and record.state is SessionState.RESERVED:
                del self._sessions[sid]
                self._lapse.pop(sid, None)
                if record.worker_id in self._workers:
                    self._workers[record.worker_id].sessions.discard(sid)
                continue
            if record is None or record.state is not SessionState.MIGRATING:
                continue
            self._sessions[sid] = dataclasses.replace(
                record, state=SessionState.ORPHANED, updated=now
            )
            if record.worker_id in self._workers:
                self._workers[record.worker_id].sessions.discard(sid)
            self._lapse[sid] = now + self._orphan_ttl_s

    @staticmethod
    def _load(w: _Worker) -> int:
        return max(w.info.load, len(w.sessions))

    def _effective(self, w: _Worker) -> WorkerInfo:
        return dataclasses.replace(w.info, load=self._load(w))
