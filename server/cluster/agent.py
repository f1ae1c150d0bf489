"""The worker's side of scale-out: registration, heartbeats, checkpoints and drain.

``WorkerAgent`` is this worker in the session directory (server/cluster/directory/), next to the
``Service`` (server/service.py) that holds its sessions:

- Registration: the worker registers (``starting`` while the model loads, then
  ``serving``, ``draining`` once a drain begins) and heartbeats its load, capacity and
  utilisation every ``worker_heartbeat_s`` with a TTL of ``worker_ttl_s``. A heartbeat
  after the worker was reaped re-registers it. The record names this process (a random
  ``instance``): a worker restarted within its TTL orphans its previous process's sessions.
- Multi-worker mode (``directory_url`` set, ``shared``): the agent is the service's
  ``Remote``. A ``start`` must carry a reservation the router placed on this worker, and
  claims it (``claim_reservation``: once only, before any frame is made); a
  resume of a session this worker does not hold is answered from the handoff in the
  directory; every ``snapshot_interval_s`` each running session is checkpointed (its
  handoff written to the directory, its record's block_idx updated) so that a worker
  killed without draining loses at most that much. While the directory cannot be reached
  the worker refuses new sessions (``directory_unavailable``, readyz 503) and keeps
  serving the ones it has.
- Embedded mode (no URL): a ``MemoryDirectory`` no one else reads; sessions start
  without a reservation, there are no checkpoints, and a drain ends the sessions.
- Drain (SIGTERM or ``POST /admin/drain``): stop admitting, then for each session:
  suspend it at a block boundary (``Migration.hand_off``, server/cluster/migration.py), place it on
  another worker (``place_session``), write the handoff, mark it ``migrating`` (it holds
  the target's slot for ``handover_ttl_s`` at most, until its client resumes there) and
  send its client ``migrate`` with the target's URL. With no worker free the client is told to ask the
  router later. Sessions not handed over by ``drain_timeout_s`` end (``shutdown``); then
  the worker deregisters and ``drained`` is set (the CLI exits on it). Leaving is bounded
  too (the drain's deadline plus 5 s): a worker that cannot deregister exits anyway and the
  directory forgets it when its TTL runs out.

Background loops have the house shape: ``CancelledError`` exits quietly, other errors are
logged, ``stop()`` cancels then awaits.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Coroutine
from contextlib import suppress
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from worldserve.protocol import Migrate, Resume
from worldserve.server.cluster.background import spawn
from worldserve.server.cluster.directory import (
    Directory,
    DirectoryError,
    DirectoryUnavailable,
    NoWorkerAvailable,
    SessionRecord,
    SessionState,
    UnknownSession,
    UnknownWorker,
    WorkerInfo,
    WorkerState,
)
from worldserve.server.cluster.migration import Migration
from worldserve.server.cluster.signing import sign, sign_worker, trusted_workers, verify
from worldserve.server.metrics import Metrics
from worldserve.server.remote import PlacementRequired, SessionMoved
from worldserve.server.service import Service
from worldserve.server.settings import Settings
from worldserve.session.errors import BadToken, SessionStateMissing
from worldserve.session.handoff import Handoff, HandoffError, decode
from worldserve.session.session import hash_token

log = logging.getLogger("worldserve.cluster")

T = TypeVar("T")

# Ends after which the session is gone for good: its client was told ``ended`` (release
# its record and snapshot). A migrated session's record has moved on to its target.
_FINAL_ENDS = frozenset(
    {"client_close", "deleted", "expired", "evicted", "refused", "failed", "shutdown"}
)


def ws_url(address: str) -> str:
    """A worker's WebSocket URL from its advertised http(s) base URL."""
    parts = urlsplit(address)
    scheme = {"https": "wss", "http": "ws"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + "/v1/ws", "", ""))


class WorkerAgent:
    """This worker in the session directory; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        service: Service,
        metrics: Metrics,
        directory: Directory,
        *,
        shared: bool,
    ) -> None:
        self.settings = settings
        self.service = service
        self.metrics = metrics
        self.directory = directory
        self.shared = shared
        # checkpoints, hand-offs and adoption, on the service's parts
        self.migration = Migration(settings, metrics, service.clock, service.table, service.shape, service.gate)
        self.address = settings.advertise or f"http://{settings.host}:{settings.port}"
        self.worker_id = settings.worker_id or _worker_id(self.address)
        self.instance = secrets.token_hex(8)  # this process: a restart orphans what the last one held
        self.drained = asyncio.Event()  # set once a drain has handed over or ended everything
        self.directory_ok = True
        self._registered = False
        self._draining = False
        self._loops: list[asyncio.Task[None]] = []
        self._drain: asyncio.Task[None] | None = None
        self._spawned: set[asyncio.Task[None]] = set()
        if shared:
            service.remote = self

    # --- lifecycle ---

    @property
    def state(self) -> WorkerState:
        if self._draining:
            return WorkerState.DRAINING
        return WorkerState.SERVING if self.service.ready else WorkerState.STARTING

    async def start(self) -> None:
        self._loops.append(asyncio.create_task(self._heartbeat_loop(), name="worker-heartbeat"))
        if self.shared and self.settings.snapshot_interval_s > 0:
            self._loops.append(asyncio.create_task(self._checkpoint_loop(), name="worker-checkpoints"))

    async def stop(self) -> None:
        """Stop the loops and leave the directory (sessions still on this worker are
        orphaned there: resumable elsewhere from their last checkpoint)."""
        await self._stop_loops()
        if self._drain is not None and not self._drain.done():
            self._drain.cancel()
            with suppress(asyncio.CancelledError):
                await self._drain
        if self._spawned:
            await asyncio.wait(list(self._spawned), timeout=2.0)
        if self._registered:
            with suppress(DirectoryError):
                await self.directory.deregister_worker(self.worker_id)
            self._registered = False
        await self.directory.close()

    async def _stop_loops(self, name: str | None = None) -> None:
        stopping = [t for t in self._loops if name is None or t.get_name() == name]
        self._loops = [t for t in self._loops if t not in stopping]
        for task in stopping:
            task.cancel()
        for task in stopping:
            with suppress(asyncio.CancelledError):
                await task

    # --- the service's Remote ---

    def unhealthy(self) -> str | None:
        return None if self.directory_ok else "directory unavailable"  # why: in the log, not on /readyz

    async def admit(self, reservation: str | None) -> None:
        if reservation is None:
            raise PlacementRequired(
                "this worker is one of several: ask the router for a worker and a "
                "reservation (POST /v1/place) and start with its session_id"
            )
        if await self._call(self.directory.claim_reservation(reservation, self.worker_id)):
            return  # used up: a second start with this id finds it taken
        rec = await self._call(self.directory.get_session(reservation))
        if rec is None:
            where = "unknown, or lapsed"
        elif rec.worker_id == self.worker_id and rec.state is not SessionState.RESERVED:
            where = "used already"
        else:
            where = f"{rec.state.value} on worker {rec.worker_id!r}"
        raise PlacementRequired(
            f"reservation {reservation!r} is not held by this worker ({where}): ask the "
            f"router for a new one"
        )

    async def authorize(self, session_id: str, token: str) -> None:
        rec = await self._call(self.directory.get_session(session_id))
        if rec is not None:
            self._check(rec, token)

    def _check(self, rec: SessionRecord, token: str | None) -> None:
        """Where the session is and, given a token, that it is the session's: from the
        directory's record alone, before any hand-off is fetched."""
        if rec.worker_id != self.worker_id:
            raise SessionMoved(rec.session_id, rec.worker_id)
        if token is not None and rec.token_hash and not hmac.compare_digest(
                rec.token_hash, hash_token(token).hex()):
            self.metrics.resumes.labels("bad_token").inc()
            raise BadToken(rec.session_id)

    async def fetch(self, session_id: str, token: str | None = None) -> Handoff | None:
        rec = await self._call(self.directory.get_session(session_id))
        if rec is None:
            return None
        self._check(rec, token)
        return await self._handoff(session_id)

    async def _handoff(self, session_id: str) -> Handoff:
        data = await self._call(self.directory.get_snapshot(session_id))
        if data is None:
            raise SessionStateMissing(session_id)
        try:
            return decode(verify(self.settings.cluster_secret, session_id, data))
        except HandoffError as exc:
            log.warning("unusable handoff in the directory: %s", exc, extra={"sid": session_id})
            raise SessionStateMissing(session_id) from exc

    async def adopt(self, msg: Resume) -> None:
        sid = msg.session_id
        if sid in self.service.table:
            return
        rec = await self._call(self.directory.get_session(sid))
        if rec is None:
            return
        self._check(rec, msg.token)
        handoff = await self._handoff(sid)
        if sid not in self.service.table:
            self.migration.adopt(handoff, msg, bytes.fromhex(rec.token_hash) if rec.token_hash else None)

    def opened(self, session_id: str, epoch: int) -> None:
        self._spawn(self._record(session_id, epoch, 0), session_id)

    def resumed(self, session_id: str, epoch: int, next_block: int) -> None:
        self._spawn(self._record(session_id, epoch, next_block), session_id)

    def ended(self, session_id: str, reason: str) -> None:
        if reason in _FINAL_ENDS:
            self._spawn(self._forget(session_id), session_id)

    # --- drain ---

    def begin_drain(self) -> asyncio.Task[None]:
        """Start draining (idempotent); the task ends when every session is handed over
        or ended and the worker has left the directory."""
        if self._drain is None:
            self._draining = True
            self.service.draining = True
            self._drain = asyncio.create_task(self._drain_all(), name="worker-drain")
        return self._drain

    async def _drain_all(self) -> None:
        t0 = time.monotonic()
        deadline = t0 + self.settings.drain_timeout_s
        log.info("draining", extra={"sessions": len(self.service.sessions())})
        try:
            with suppress(DirectoryError):
                await self._call(self.directory.set_worker_state(self.worker_id, WorkerState.DRAINING))
            await self._stop_loops("worker-checkpoints")  # it must not overwrite a handoff
            while sids := self.service.sessions():
                left = deadline - time.monotonic()
                if left <= 0:
                    for sid in sids:
                        self.service.close(sid, "shutdown")
                    log.warning("drain timed out; ended %d sessions", len(sids))
                    break
                with suppress(TimeoutError):
                    await asyncio.wait_for(
                        asyncio.gather(*(self._migrate(sid) for sid in sids)), left
                    )
                if self.service.sessions():
                    await asyncio.sleep(0.25)
            try:  # leaving is bounded too: the directory forgets a worker whose TTL ran out
                await asyncio.wait_for(self._leave(), max(0.0, deadline - time.monotonic()) + 5.0)
            except TimeoutError:
                log.warning("drain: leaving the directory timed out; the worker's TTL expires it")
            log.info("drained", extra={"seconds": round(time.monotonic() - t0, 3)})
        except Exception:
            log.exception("drain failed")
        finally:
            self.drained.set()

    async def _leave(self) -> None:
        """Stop the loops (no heartbeat may register the worker again), then deregister."""
        await self._stop_loops()
        with suppress(DirectoryError):
            await self._call(self.directory.deregister_worker(self.worker_id))
            self._registered = False

    async def _migrate(self, sid: str) -> None:
        """Hand one session over; errors are logged and the drain loop tries again."""
        try:
            handoff = await self.migration.hand_off(sid)
            if handoff is None:
                return
            if not self.shared:  # nobody else can take it
                self.service.close(sid, "shutdown")
                return
            target: WorkerInfo | None = None
            retry_after: float | None = None
            try:
                among = await self._call(trusted_workers(self.directory, self.settings.cluster_secret,
                                                         self.settings.allowed_workers))
                target = await self._call(
                    self.directory.place_session(sid, self.settings.placement_threshold, among=among)
                )
            except NoWorkerAvailable as exc:
                retry_after = exc.retry_after_s
            blob = sign(self.settings.cluster_secret, sid, handoff.encode())
            await self._call(self.directory.put_snapshot(sid, blob, self.settings.snapshot_ttl_s))
            holder = target.worker_id if target is not None else self.worker_id
            record = SessionRecord(sid, holder, handoff.epoch, handoff.next_block, SessionState.MIGRATING)
            await self._call(self.directory.update_session(record))
            url = ws_url(target.address) if target is not None else ""
            self.migration.migrated(sid, Migrate(sid, url, handoff.next_block, holder if target else "", retry_after))
            log.info("session handed over", extra={"sid": sid, "target": holder if target else "",
                                                   "next_block": handoff.next_block})
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.metrics.migrations.labels("failed").inc()
            log.warning("hand-over failed: %s: %s", type(exc).__name__, exc, extra={"sid": sid})

    # --- loops ---

    async def _heartbeat_loop(self) -> None:
        try:
            while True:
                await self._beat()
                await asyncio.sleep(self.settings.worker_heartbeat_s)
        except asyncio.CancelledError:
            pass

    async def _beat(self) -> None:
        svc, s = self.service, self.settings
        load, util = len(svc.store), max(0.0, float(svc.utilisation()))
        try:
            if self._registered:
                try:
                    await self._call(self.directory.heartbeat(
                        self.worker_id, load, util, self.state, s.worker_ttl_s
                    ))
                    return
                except UnknownWorker:
                    log.warning("the directory forgot this worker; registering again")
                    self._registered = False
            info = sign_worker(s.cluster_secret, WorkerInfo(self.worker_id, self.address, self.state, s.capacity,
                                                             load, util, instance=self.instance))
            await self._call(self.directory.register_worker(info, s.worker_ttl_s))
            self._registered = True
            log.info("registered", extra={"worker_id": self.worker_id, "address": self.address,
                                          "state": self.state.value})
        except DirectoryError:
            pass  # counted and logged by _call; the next beat tries again
        except Exception:
            log.exception("heartbeat failed")

    async def _checkpoint_loop(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.settings.snapshot_interval_s)
                sids = self.service.sessions()
                handoffs = await asyncio.gather(*(self.migration.checkpoint(sid) for sid in sids),
                                                return_exceptions=True)
                for h in handoffs:
                    if isinstance(h, Handoff):
                        await self._store_checkpoint(h)
                    elif isinstance(h, BaseException):
                        log.warning("checkpoint failed: %r", h)
        except asyncio.CancelledError:
            pass

    async def _store_checkpoint(self, h: Handoff) -> None:
        rec = SessionRecord(h.session_id, self.worker_id, h.epoch, h.next_block, SessionState.ACTIVE,
                            token_hash=self._token_hash(h.session_id))
        try:
            # The record first: it refuses if the session moved on, before its snapshot
            # could be overwritten.
            try:
                await self._call(self.directory.update_session(rec))
            except UnknownSession:  # the directory lost it (evicted, flushed): write it again
                if not await self._call(self.directory.recreate_session(rec)):
                    raise
                log.warning("the directory had lost the session's record; written again", extra={"sid": h.session_id})
            blob = sign(self.settings.cluster_secret, h.session_id, h.encode())
            await self._call(self.directory.put_snapshot(h.session_id, blob, self.settings.snapshot_ttl_s))
            self.metrics.snapshots.labels("ok").inc()
        except (DirectoryError, ValueError) as exc:
            self.metrics.snapshots.labels("failed").inc()
            if not isinstance(exc, DirectoryUnavailable):
                log.info("checkpoint not stored: %s", exc, extra={"sid": h.session_id})

    # --- helpers ---

    async def _record(self, sid: str, epoch: int, next_block: int) -> None:
        rec = SessionRecord(sid, self.worker_id, epoch, next_block, SessionState.ACTIVE,
                            token_hash=self._token_hash(sid))
        with suppress(DirectoryError, ValueError):
            await self._call(self.directory.update_session(rec))

    def _token_hash(self, sid: str) -> str:
        session = self.service.store.peek(sid)
        return session.token_hash.hex() if session is not None else ""

    async def _forget(self, sid: str) -> None:
        with suppress(DirectoryError):
            rec = await self._call(self.directory.get_session(sid))
            if rec is not None and rec.worker_id == self.worker_id:
                await self._call(self.directory.release_session(sid))
                await self._call(self.directory.delete_snapshot(sid))

    def _spawn(self, coro: Coroutine[Any, Any, None], sid: str) -> None:
        spawn(self._spawned, coro, log, "directory update", sid)

    async def _call(self, pending: Awaitable[T]) -> T:
        """Await a directory call, keeping track of whether the directory answers."""
        try:
            result = await pending
        except DirectoryUnavailable as exc:
            if self.directory_ok:
                log.warning("session directory unavailable: %s", exc.reason)
            self.directory_ok = False
            self.metrics.directory_up.set(0)
            raise
        except (UnknownSession, UnknownWorker, NoWorkerAvailable):
            self._up()
            raise
        self._up()
        return result

    def _up(self) -> None:
        if not self.directory_ok:
            log.info("session directory reachable again")
        self.directory_ok = True
        self.metrics.directory_up.set(1)


def _worker_id(address: str) -> str:
    """A readable id from the address: ``127.0.0.1-8001``."""
    parts = urlsplit(address)
    host = (parts.hostname or "worker").replace(":", "-")
    return f"{host}-{parts.port or (443 if parts.scheme == 'https' else 80)}"
