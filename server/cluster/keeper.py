"""What outlives the process, on a store (server/store/): saved worlds and, in the embedded
single-worker mode, crash checkpoints.

``Keeper`` is the core's ``Worlds`` (server/saved.py) wherever a store is configured, and, in the
embedded mode only (no shared directory), the service's ``Remote`` (server/remote.py), the part
the multi-worker mode gives its ``WorkerAgent``; server/cluster/worker.py makes it.

- Saved worlds. ``save`` packages a session as a crash checkpoint does (``Migration``: its
  snapshot, its request, its held action; read between two engine steps, the session goes on)
  and keeps it on the shelf (server/worlds.py) under a name, owned by the SHA-256 of the session's
  token. ``fork`` opens a new session (new id, new token) from a world: the world's model state
  at the world's next block, its prompt, seed, size and rate, its held action; the client's
  codec, quality and mode. Given the same actions, a fork makes the frames the original made
  from that point.
- Crash checkpoints. Every ``snapshot_interval_s`` each running session is packaged
  (``Migration.checkpoint``) and written to ``sessions/s<id>/handoff``; its token's hash goes to
  ``sessions/s<id>/token`` whenever it changes (a start, every resume rotates it). After a
  restart, a ``resume`` of a session this process does not hold adopts its checkpoint
  (``Migration.adopt``, as a worker adopts another's) and resumes with the gap the
  multi-worker mode reports: ``resumed.gap_blocks``, the blocks shown after the checkpoint.
  A session that ends for good (closed, deleted, expired, shut down) has its checkpoint
  deleted; one older than ``snapshot_ttl_s`` is swept when the server starts.

Store I/O runs on worker threads (``asyncio.to_thread``), never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Coroutine
from contextlib import suppress
from dataclasses import replace
from typing import Any

from aiohttp import web

from worldserve.protocol import Resume, Saved, Start, Started
from worldserve.server.cluster.background import spawn
from worldserve.server.cluster.migration import Migration
from worldserve.server.inputs import seconds
from worldserve.server.limits import TokenBucket
from worldserve.server.live import Live, Peer
from worldserve.server.metrics import Metrics
from worldserve.server.remote import PlacementRequired
from worldserve.server.saved import NoStore
from worldserve.server.service import Service
from worldserve.server.settings import Settings
from worldserve.server.store import NoSuchObject, Store, StoreError, open_store, resolve_store
from worldserve.server.worlds import WorldError, WorldMeta, WorldShelf
from worldserve.session.degrade import Rung
from worldserve.session.errors import BadToken
from worldserve.session.handoff import Handoff, HandoffError, decode
from worldserve.session.plan import ModelState
from worldserve.session.presentation import Presentation
from worldserve.session.session import Session, SessionConfig, hash_token

log = logging.getLogger("worldserve.keeper")

CHECKPOINT_KIND = 1  # the store's kind of a checkpoint object (a handoff, session/handoff.py)
TOKEN_KIND = 2  # of a token-hash object (32 bytes)
_FINAL_ENDS = frozenset({"client_close", "deleted", "expired", "evicted", "refused", "failed", "shutdown"})


def _names(sid: str) -> tuple[str, str]:
    """A session's checkpoint and token objects (an id may start with ``-``: prefixed)."""
    return f"sessions/s{sid}/handoff", f"sessions/s{sid}/token"


class Keeper:
    """Saved worlds and embedded crash checkpoints on ``store``; see the module docstring."""

    def __init__(self, settings: Settings, service: Service, metrics: Metrics, store: Store | str, *,
                 checkpoints: bool) -> None:
        """``store``: the store, or its URL (``auto`` too), opened when the app starts."""
        self.settings, self.service, self.metrics = settings, service, metrics
        self._store: Store | None = None if isinstance(store, str) else store
        self._shelf: WorldShelf | None = None if isinstance(store, str) else WorldShelf(store)
        self._url = store if isinstance(store, str) else None
        self.migration = Migration(settings, metrics, service.clock, service.table, service.shape, service.gate)
        self.checkpoints = checkpoints and settings.snapshot_interval_s > 0
        self._loop: asyncio.Task[None] | None = None
        self._spawned: set[asyncio.Task[None]] = set()
        if self.checkpoints:
            service.remote = self

    # --- lifecycle ---

    @property
    def store(self) -> Store:
        if self._store is None:
            raise NoStore()  # auto found nothing writable
        return self._store

    @property
    def shelf(self) -> WorldShelf:
        self.store  # noqa: B018 -- raises without one
        assert self._shelf is not None
        return self._shelf

    async def ctx(self, app: web.Application) -> AsyncIterator[None]:
        """The app's ``cleanup_ctx``: the store opened (off the loop), the checkpoint loop run while the app
        does. A store that cannot be opened stops the app, naming it; ``auto`` where nothing is writable
        leaves the server without one."""
        if self._url is not None:
            url = await asyncio.to_thread(resolve_store, self._url)
            if url is not None:
                opened: Store = await asyncio.to_thread(open_store, url)
                self._store, self._shelf = opened, WorldShelf(opened)
                log.info("store open", extra={"store": opened.url})
        if self._store is None and self.service.remote is self:
            self.service.remote, self.checkpoints = None, False
        if self.checkpoints:
            self._loop = asyncio.create_task(self._checkpoint_loop(), name="keeper-checkpoints")
            self._spawn(self._sweep(), "")
        yield
        if self._loop is not None:
            self._loop.cancel()
            with suppress(asyncio.CancelledError):
                await self._loop
        if self._spawned:
            await asyncio.wait(list(self._spawned), timeout=5.0)

    # --- saved worlds (server/saved.py's Worlds) ---

    async def save(self, session_id: str, name: str) -> Saved:
        """Keep the session's state now as a world named ``name``; WorldError if it has none yet."""
        live = self.service.live(session_id)
        session = self.service.store.peek(session_id)
        if live is None or session is None:
            raise WorldError(f"no session {session_id!r} here to save")
        h = await self.migration.checkpoint(session_id)
        if h is None and live.suspension is not None and live.suspension.state is not None:  # detached
            h = self.migration._package(live, live.suspension, "checkpoint", 0)
        if h is None or h.next_block == 0:
            raise WorldError(f"session {session_id!r} has made no frames to save yet")
        frames = self.service.shape.block_start(h.next_block)
        meta = await asyncio.to_thread(self.shelf.save, name, session.token_hash.hex(), self.settings.model,
                                       frames, h.encode())
        log.info("world saved", extra={"sid": session_id, "world": meta.id, "frames": frames})
        return Saved(meta.id, meta.name, meta.frames, h.next_block)

    async def fork(self, req: Start, peer: Peer, client: tuple[str, ...] = ()) -> Started:
        """A new session from the world ``req.world`` (see the module docstring)."""
        svc, s, shape = self.service, self.settings, self.service.shape
        engine = svc.gate.require_admitting(1.0)
        assert req.world is not None
        svc.quotas.take(client, lambda sid: sid in svc.table)
        meta, h, origin, state = await self._world(req.world)
        if svc.remote is not None:
            await svc.remote.admit(req.session_id)
        push = req.mode == "push"
        request = replace(h.request, codec=req.codec, quality=req.quality, mode=req.mode, lookahead=req.lookahead,
                          deadline_ms=req.deadline_ms, world=meta.id)
        if request.bucket not in shape.buckets:
            raise WorldError(f"world {meta.id!r} is of bucket {request.bucket}; served: {list(shape.buckets)}")
        svc.admit.check(engine, request)
        runner = engine.runner
        if runner.capabilities.ready_restore:  # a canvas rebuilt, off the model thread
            await asyncio.to_thread(runner.ready_restore, state)
        k, start = h.next_block, shape.block_start
        fps = shape.rate(request.fps)
        config = SessionConfig(fps=fps, bucket=request.bucket, steps=shape.max_steps,
                               lookahead=request.lookahead if push else 0, mode=request.mode, seed=request.seed)
        token = secrets.token_urlsafe(24)
        session = Session(config, hash_token(token), session_id=req.session_id, scene=origin.scene,
                          epoch=origin.epoch, clock=svc.clock, log=origin.log, blocks_committed=k,
                          last_block_idx=k - 1, frames_due=start(k), frames_committed=start(k))
        session.accept_block(k, shape.block_frames(k))
        svc.store.install(session)
        sid, step_us = session.id, 1e6 / fps
        live = Live(
            session, request, TokenBucket(s.max_actions_per_s, s.action_burst, svc.clock),
            deque(maxlen=s.replay_blocks), Rung(fps, config.lookahead, shape.max_steps, request.bucket),
            svc.clock(), TokenBucket.per_chunk(fps, shape.chunk_frames, s.input_burst, svc.clock),
            action=h.action,  # held as the world was saved; the fork's client numbers its own from 1
            presentation=h.presentation or Presentation(start(k), start(k) * step_us),
        )
        verdict = svc.admit.schedule(engine, live, k, restore=state)
        if not verdict.admitted:
            svc.store.close(sid)
            raise svc.admit.refused(verdict)
        live.restored = (k, state)
        svc.table.add(live)
        started = replace(svc.admit.started(live, token), block_idx=k, world=meta.id)
        svc.admit.attach(live, peer, started, [])
        if live.pull:
            engine.request_block(sid, k, seconds(req.deadline_ms))
        svc.quotas.opened(client, sid)
        self.metrics.sessions_started.labels(req.mode).inc()
        if svc.remote is not None:
            svc.remote.opened(sid, live.epoch)
        log.info("session forked", extra={"sid": sid, "world": meta.id, "block_idx": k})
        return started

    async def _world(self, world_id: str) -> tuple[WorldMeta, Handoff, Session, ModelState]:
        meta, data = await asyncio.to_thread(self.shelf.state, world_id)
        if meta.model != self.settings.model:
            raise WorldError(f"world {world_id!r} was made by model {meta.model!r}; this server runs "
                             f"{self.settings.model!r}")
        try:
            h = await asyncio.to_thread(decode, data)
            origin, state = h.restore(self.service.clock)
        except HandoffError as exc:
            raise WorldError(f"world {world_id!r} cannot be read: {exc}") from None
        return meta, h, origin, state

    async def list(self) -> list[WorldMeta]:
        return await asyncio.to_thread(self.shelf.list)

    async def delete(self, world_id: str, token: str | None, admin: bool) -> None:
        owner = hash_token(token).hex() if token else None
        await asyncio.to_thread(self.shelf.delete, world_id, owner, admin)

    # --- the service's Remote (embedded crash checkpoints) ---

    def unhealthy(self) -> str | None:
        return None

    async def admit(self, reservation: str | None) -> None:
        if reservation is not None:
            raise PlacementRequired("this server is a single worker and takes no reservation: start "
                                    "without session_id")

    async def authorize(self, session_id: str, token: str) -> None:
        kept = await self._token_hash(session_id)
        if kept is not None and not secrets.compare_digest(kept, hash_token(token)):
            self.metrics.resumes.labels("bad_token").inc()
            raise BadToken(session_id)

    async def fetch(self, session_id: str, token: str | None = None) -> Handoff | None:
        if token is not None:
            await self.authorize(session_id, token)
        return await self._checkpoint(session_id)

    async def adopt(self, msg: Resume) -> None:
        sid = msg.session_id
        if sid in self.service.table:
            return
        kept = await self._token_hash(sid)
        if kept is not None and not secrets.compare_digest(kept, hash_token(msg.token)):
            self.metrics.resumes.labels("bad_token").inc()
            raise BadToken(sid)
        h = await self._checkpoint(sid)
        if h is not None and sid not in self.service.table:
            self.migration.adopt(h, msg, kept)

    def opened(self, session_id: str, epoch: int) -> None:
        self._spawn(self._put_token(session_id), session_id)

    def resumed(self, session_id: str, epoch: int, next_block: int) -> None:
        self._spawn(self._put_token(session_id), session_id)

    def ended(self, session_id: str, reason: str) -> None:
        if reason in _FINAL_ENDS:
            self._spawn(self._forget(session_id), session_id)

    # --- checkpoints ---

    async def _checkpoint_loop(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.settings.snapshot_interval_s)
                for sid in self.service.sessions():
                    try:
                        h = await self.migration.checkpoint(sid)
                        if h is not None and sid in self.service.table:
                            await asyncio.to_thread(self.store.put, _names(sid)[0], h.encode(), CHECKPOINT_KIND)
                            self.metrics.snapshots.labels("ok").inc()
                    except Exception as exc:  # a store error: the next round tries again
                        self.metrics.snapshots.labels("failed").inc()
                        log.warning("checkpoint not stored: %s: %s", type(exc).__name__, exc, extra={"sid": sid})
        except asyncio.CancelledError:
            pass

    async def _checkpoint(self, sid: str) -> Handoff | None:
        try:
            kind, data = await asyncio.to_thread(self.store.get, _names(sid)[0])
            if kind != CHECKPOINT_KIND:
                raise HandoffError(f"an object of kind {kind}, not a checkpoint")
            return decode(data)
        except NoSuchObject:
            return None
        except (StoreError, HandoffError) as exc:
            log.warning("unusable checkpoint: %s", exc, extra={"sid": sid})
            return None

    async def _token_hash(self, sid: str) -> bytes | None:
        try:
            kind, data = await asyncio.to_thread(self.store.get, _names(sid)[1])
        except StoreError:
            return None
        return data if kind == TOKEN_KIND and len(data) == 32 else None

    async def _put_token(self, sid: str) -> None:
        session = self.service.store.peek(sid)
        if session is not None:
            await asyncio.to_thread(self.store.put, _names(sid)[1], session.token_hash, TOKEN_KIND)

    async def _forget(self, sid: str) -> None:
        for name in _names(sid):
            await asyncio.to_thread(self.store.delete, name)

    async def _sweep(self) -> None:
        """Delete checkpoints older than ``snapshot_ttl_s`` (their clients are long gone), and a token
        left without its checkpoint (a session ended, or never checkpointed, before the last process
        stopped): nothing can resume from it."""
        names = await asyncio.to_thread(self.store.list, "sessions")
        for sid in sorted({name.split("/")[1][1:] for name in names}):
            h = await self._checkpoint(sid)
            if sid not in self.service.table and (h is None or time.time() - h.created > self.settings.snapshot_ttl_s):
                await self._forget(sid)

    def _spawn(self, coro: Coroutine[Any, Any, None], sid: str) -> None:
        spawn(self._spawned, coro, log, "store update", sid)
