"""Session lifecycle: the store, the engine and the transports, glued together.

The ``SessionStore`` (session/store.py) decides identity and lifetime: ids and resume
tokens, capacity (refusals carry retry-after), block_idx epochs, detach/resume and the
detached TTL. The ``Engine`` (server/engine.py) generates. A transport (``Peer``: the
WebSocket connection; WebRTC later) is attached to at most one session at a time and is
handed finished chunks and events.

Block numbering. ``start`` is block 0 of a new epoch. In pull mode the store checks every
``block`` request (next, retransmit of the last, or 0 for a new epoch; anything else is
stale) and the engine generates exactly those. In push mode the scheduler numbers blocks
on the session's frame clock; the store keeps the epoch and the session's lifetime.

Detach and resume: generation PAUSES while detached. When a connection drops, the
session is detached in the store and suspended in the engine between two steps (its
model state exported, its scheduling stopped), so a detached session costs no model time
and no KV slot and produces nothing that could be lost. Every session also keeps its last
``replay_blocks`` generated chunks, because frames sent just before a drop may never
have arrived. ``resume`` with the token and the next block_idx N the client wants
re-sends the buffered blocks N..K-1 (K: the first block not generated), then adds the
session back to the engine at block K from the exported state: no gap, no repeat. An N
outside that range is refused (``stale_block``), N = 0 starts a new epoch. A resume while
another connection holds the session takes it over (the old one is told ``replaced``).

The rest of ``Service`` lives in its base classes, each working on the service's state:
client inputs (``action``, ``prompt``, ``observe``, pull-mode ``block``) in
server/inputs.py (``InputMixin``); the engine's and the store's callbacks (chunks to the
peer, scheduler events, step metrics, sessions ending) in server/engine_events.py
(``EngineEventsMixin``). Scale-out (DESIGN.md §7): checkpoints, hand-offs, ``migrated``
and the adoption of another worker's handoff on resume live in server/migration.py
(``MigrationMixin``); the directory side lives in server/cluster.py, reached through
``self.remote``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace
from typing import Any

import numpy as np

from protocol import CloseCode, Ended, ProtocolError, Resume, Resumed, Start, Started
from server.engine import Engine, Suspension
from server.engine_events import EngineEventsMixin
from server.inputs import InputMixin, seconds
from server.limits import TokenBucket
from server.live import (
    BlockUnavailable,
    Chunk,
    Live,
    ModelFull,
    NotReady,
    Peer,
    Phase,
    PlacementRequired,
    Remote,
    rebucket,
)
from server.metrics import Metrics
from server.migration import MigrationMixin
from server.offload import CodecPool
from server.settings import Settings
from session.admission import Admission
from session.costmodel import CostModel
from session.degrade import Settings as Rung
from session.errors import BadToken, IllegalTransition, SessionStateMissing
from session.plan import CONTROLS, BatchTiming, ModelState, Runner, SessionSpec
from session.scheduler import Mode, RunnerInfo, Scheduler
from session.session import Session, SessionConfig, SessionStatus, hash_token

# Session types live in server/live.py; re-exported here for the transports.
__all__ = [
    "BlockUnavailable",
    "Chunk",
    "Live",
    "ModelFull",
    "NotReady",
    "Peer",
    "Phase",
    "Service",
]

log = logging.getLogger("worldserve.service")


class Service(InputMixin, EngineEventsMixin, MigrationMixin):
    """Sessions of one worker; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        *,
        codecs: CodecPool | None = None,
    ) -> None:
        from session.store import SessionStore

        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.codecs = codecs or CodecPool()  # images decode here, off the loop (the app opens it)
        self.store = SessionStore(
            settings.capacity,
            settings.detached_ttl_s,
            clock=clock,
            on_dispose=self._disposed,
            retry_after_s=settings.admission_retry_after_s,
        )
        self.phase = Phase.WARMING
        self.failure: str | None = None
        self.engine: Engine | None = None
        self.buckets: tuple[int, ...] = ()
        self.chunk_frames = 1
        self.max_steps = 1
        self.info: RunnerInfo | None = None  # the runner's shape (frame sizes, block frames, controls)
        self.controls = CONTROLS  # what the model takes (``started.controls``)
        self._live: dict[str, Live] = {}
        self._evicted_seen = 0
        self._reaper: asyncio.Task[None] | None = None
        self.remote: Remote | None = None  # the shared directory (server/cluster.py), if any
        self.draining = False  # handing sessions over: no new sessions or resumes here
        metrics.track_sessions(self.counts)

    # --- lifecycle ---

    async def start_engine(
        self, runner: Runner, executor: Any, timings: list[BatchTiming], buckets: tuple[int, ...]
    ) -> None:
        """Build the scheduler and engine from a warmed runner and start serving."""
        s = self.settings
        self.buckets = buckets
        self.chunk_frames = runner.frames_per_chunk
        self.max_steps = runner.max_steps
        self.info = info = RunnerInfo.of(runner, s.warmup_batch_sizes, buckets)
        self.controls = info.controls
        scheduler = Scheduler(info, CostModel(timings), self.clock, s.scheduler_options())
        self.engine = Engine(
            scheduler,
            runner,
            executor=executor,
            batching=s.batching,
            on_event=self._on_event,
            on_step=self._on_step,
        )
        await self.engine.start()
        self._reaper = asyncio.create_task(self._reap_loop(), name="worldserve-reaper")
        self.phase = Phase.READY
        log.info("ready", extra={"buckets": list(buckets), "capacity": s.capacity})

    def fail(self, reason: str) -> None:
        self.phase = Phase.FAILED
        self.failure = reason

    def begin_shutdown(self) -> None:
        """Stop admitting and end every session (their peers are told ``shutdown``)."""
        if self.phase is not Phase.FAILED:
            self.phase = Phase.DRAINING
        for live in list(self._live.values()):
            live.end_reason = "shutdown"
        self.store.clear()

    async def stop(self) -> None:
        self.begin_shutdown()
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.cancel()
            with suppress(asyncio.CancelledError):
                await reaper
        if self.engine is not None:
            await self.engine.stop()

    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY and self.engine is not None and self.engine.running

    def readiness(self) -> tuple[bool, str]:
        """(ready for a new session, why not)."""
        if self.engine is not None and self.engine.failure is not None:
            return False, "failed: engine loop died"
        if self.phase is not Phase.READY:
            return False, self.phase.value + (f": {self.failure}" if self.failure else "")
        if self.draining:
            return False, "draining"
        problem = self.remote.unhealthy() if self.remote is not None else None
        if problem is not None:
            return False, problem
        if self.store.active_count >= self.store.capacity:
            return False, "full"
        return True, "ready"

    def _require_ready(self) -> Engine:
        if not self.ready or self.engine is None:
            phase = Phase.FAILED if self.phase is Phase.READY else self.phase
            raise NotReady(phase, 1.0 if phase is Phase.WARMING else 5.0)
        return self.engine

    # --- session start, resume, detach, end ---

    async def start(self, req: Start, peer: Peer) -> Started:
        """``open`` behind the directory: in multi-worker mode the ``start`` must carry a
        reservation the router made on this worker (refused otherwise, and refused while
        the directory cannot be reached rather than serving a session nobody can find)."""
        engine = self._require_ready()
        if self.draining:
            raise NotReady(Phase.DRAINING, 1.0)
        first = None
        if req.observation is not None and req.bucket in self.buckets:  # on the codec pool
            first = await self.decode_image(req.observation, "observation")
        elif req.bucket in self.buckets:
            # the start frame (the default world renders ~30 ms of CPU) is made here, on a
            # worker thread, not by the model thread while every running session waits
            loop = asyncio.get_running_loop()
            try:
                first = await loop.run_in_executor(None, engine.runner.first_frame, req.prompt, req.seed, req.bucket)
            except Exception:  # the runner makes its own start frame when it opens the session
                log.exception("start frame for a %d px session failed off the model thread", req.bucket)
        if self.remote is None:
            return self.open(req, peer, first_frame=first)
        await self.remote.admit(req.session_id)
        try:
            started = self.open(req, peer, session_id=req.session_id, first_frame=first)
        except BaseException:
            if req.session_id is not None and req.session_id not in self._live:
                self.remote.ended(req.session_id, "refused")  # give the reservation back
            raise
        self.remote.opened(started.session_id, started.epoch)
        return started

    def open(
        self, req: Start, peer: Peer, *, session_id: str | None = None, first_frame: np.ndarray | None = None,
    ) -> Started:
        """A new session from a ``start`` message, attached to ``peer`` (with the given id:
        a router's reservation; else a fresh one). ``first_frame``: the request's observation,
        decoded beforehand off the loop, or the runner's start frame for a request without
        one, made beforehand off the model thread."""
        engine = self._require_ready()
        if self.draining:
            raise NotReady(Phase.DRAINING, 1.0)
        if req.bucket not in self.buckets:
            raise ProtocolError(f"bucket {req.bucket} is not served; served: {list(self.buckets)}", "bucket")
        observation = first_frame
        if req.observation is not None and observation is None:
            raise ValueError("open() takes a start's observation decoded, as first_frame")
        push = req.mode == "push"
        config = SessionConfig(
            fps=req.fps,
            bucket=req.bucket,
            steps=self.max_steps,
            lookahead=req.lookahead if push else 0,
            mode=req.mode,
            seed=req.seed,
        )
        if session_id is None:
            decision = self.store.open_block(None, 0, config=config, scene=req.prompt, frames=self.block_frames(0))
            sid, token, epoch = decision.session_id, decision.token or "", decision.epoch
        else:
            if session_id in self.store:
                raise PlacementRequired(f"reservation {session_id!r} is already in use")
            token = secrets.token_urlsafe(24)
            session = Session(config, hash_token(token), session_id=session_id, scene=req.prompt,
                              clock=self.clock)
            session.accept_block(0, self.block_frames(0))
            self.store.install(session)
            sid, epoch = session_id, session.epoch
        s = self.settings
        live = Live(
            sid,
            req,
            req.prompt,
            epoch,
            TokenBucket(s.max_actions_per_s, s.action_burst, self.clock),
            deque(maxlen=s.replay_blocks),
            Rung(req.fps, config.lookahead, self.max_steps, req.bucket),
            self.clock(),
        )
        verdict = self._schedule(engine, live, 0, observation=observation)
        if not verdict.admitted:
            self.store.close(sid)  # not in _live yet: nothing else to undo
            raise self._model_full(verdict)
        self._live[sid] = live
        height, width = self.frame_size(live.settings.bucket)
        started = Started(
            sid,
            token,
            1,
            req.mode,
            req.codec,
            live.settings.fps,  # admitted: the rate its frames are paced at
            live.settings.bucket,
            width,
            height,
            self.chunk_frames,
            live.level,
            live.settings.steps,
            live.settings.lookahead,
            live.epoch,
            self.buckets,
            self.block_frames(0),
            self.controls,
        )
        self._attach(engine, live, peer, started, [])
        if live.pull:
            engine.request_block(sid, 0, seconds(req.deadline_ms))
        self.metrics.sessions_started.labels(req.mode).inc()
        log.info(
            "session started",
            extra={"sid": sid, "mode": req.mode, "codec": req.codec, "fps": req.fps,
                   "bucket": req.bucket, "ladder_level": live.level},
        )
        return started

    async def resume(self, msg: Resume, peer: Peer) -> Resumed:
        """Re-attach a detached session at the client's next block (see the docstring)."""
        self._require_ready()
        if self.draining:  # the router knows where its sessions go next
            raise NotReady(Phase.DRAINING, 0.5)
        sid = msg.session_id
        await self._adopt_from_directory(msg)
        live = self._checked(sid, msg)
        if live.peer is not None and live.peer is not peer:  # take over from a stale connection
            old = live.peer
            old.end(Ended(sid, "replaced"), CloseCode.POLICY)
            await self.disconnected(sid, old)
        if live.suspending is not None:
            await asyncio.shield(live.suspending)
        engine = self._require_ready()
        live = self._checked(sid, msg)  # it may have ended while we waited
        if live.peer is not None:
            raise IllegalTransition(sid, "attached", "resume")
        susp = live.suspension or Suspension(sid, live.next_block, None, live.level, live.settings)
        n, k = msg.block_idx, susp.next_block
        if n == 0:
            self.store.resume(sid, msg.token)
            live.suspension = None
            self._new_epoch(engine, live)
            reply = self._resumed(live, 0, 0)
            self._attach(engine, live, peer, reply, [])
            self.metrics.resumes.labels("new_epoch").inc()
            return reply
        replay = [ch for ch in live.ring if n <= ch.block_idx < k]
        gap = 0
        if n > k or (n < k and (not replay or replay[0].block_idx != n)):
            if live.adopted is None:
                oldest = live.ring[0].block_idx if live.ring else k
                self.metrics.resumes.labels("unavailable").inc()
                raise BlockUnavailable(sid, n, oldest, k)
            # A snapshot from another worker that cannot serve n: go on with a gap.
            gap, replay, k = abs(n - k), [], max(n, k)
        self.store.resume(sid, msg.token)
        state = susp.state
        verdict = self._schedule(engine, live, k, restore=state)
        if not verdict.admitted:
            self.store.detach(sid)
            self.metrics.resumes.labels("refused").inc()
            raise self._model_full(verdict)
        live.suspension = None
        live.next_block = k
        live.restored = (k, state) if state is not None else None
        if live.pull:  # requests accepted before the drop and not generated: ask again
            session = self.store.get(sid)
            for b in range(k, session.last_block_idx + 1):
                engine.request_block(sid, b)
        restored_from, live.adopted = (-1 if live.adopted is None else live.adopted), None
        reply = self._resumed(live, k if gap else n, len(replay), restored_from, gap)
        self._attach(engine, live, peer, reply, replay)
        self.metrics.resumes.labels("ok" if restored_from < 0 else "restored").inc()
        if restored_from >= 0 and self.remote is not None:
            self.remote.resumed(sid, live.epoch, k)
        log.info("session resumed", extra={"sid": sid, "block_idx": reply.block_idx,
                                           "replayed": len(replay), "restored_from": restored_from,
                                           "gap_blocks": gap})
        return reply

    def _checked(self, sid: str, msg: Resume) -> Live:
        session = self.store.peek(sid)
        live = self._live.get(sid)
        if session is None or live is None:
            self.metrics.resumes.labels("missing").inc()
            raise SessionStateMissing(sid, msg.block_idx)
        if not session.check_token(msg.token):
            self.metrics.resumes.labels("bad_token").inc()
            raise BadToken(sid)
        return live

    def _resumed(
        self, live: Live, block_idx: int, replayed: int, restored_from: int = -1, gap: int = 0
    ) -> Resumed:
        requested = -1
        if live.pull:
            session = self.store.peek(live.sid)
            requested = session.last_block_idx if session is not None else -1
        r = live.request
        height, width = self.frame_size(live.settings.bucket)
        return Resumed(
            live.sid, block_idx, live.epoch, requested, replayed, r.mode, r.codec, live.settings.fps,
            width, height, self.chunk_frames, live.level, restored_from, gap,
            self.block_frames(0), self.controls,
        )

    async def disconnected(self, sid: str, peer: Peer) -> None:
        """The peer's connection is gone: detach and suspend (resumable until the TTL)."""
        live = self._live.get(sid)
        if live is None or live.peer is not peer:
            return
        self._unbind(live)
        if self.phase is not Phase.READY:
            self.close(sid, "shutdown")
            return
        session = self.store.peek(sid)
        if session is None:
            return
        if session.status is SessionStatus.ACTIVE:
            self.store.detach(sid)
        if live.suspension is not None:  # suspended already (a hand-off is packaging it)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        live.suspending = fut
        susp = Suspension(sid, live.next_block, None, live.level, live.settings)
        try:
            if self.engine is not None and sid in self.engine.scheduler:
                susp = await self.engine.suspend(sid)
        except (KeyError, RuntimeError) as exc:  # ended meanwhile, or the engine stopped
            if self._live.get(sid) is live:
                log.warning("suspend failed: %s", exc, extra={"sid": sid})
        finally:
            live.suspending = None
            fut.set_result(None)
        if susp.state is None and live.restored is not None and live.restored[0] == susp.next_block:
            susp = replace(susp, state=live.restored[1])  # never reopened: the old state holds
        live.suspension = susp
        live.level, live.settings = susp.level, susp.settings
        log.info("session detached", extra={"sid": sid, "next_block": susp.next_block})

    def close(self, sid: str, reason: str) -> bool:
        """End a session for good; its peer (if any) is told ``ended``. False if unknown."""
        live = self._live.get(sid)
        if live is not None and live.end_reason is None:
            live.end_reason = reason
        return self.store.close(sid)

    # --- queries ---

    def block_frames(self, block_idx: int) -> int:
        """Frames of block ``block_idx`` of an epoch (a latent family's block 0 holds fewer)."""
        return self.info.frames_in_block(block_idx) if self.info is not None else self.chunk_frames

    def block_start(self, block_idx: int) -> int:
        """The epoch frame index of block ``block_idx``'s first frame."""
        return self.info.block_start(block_idx) if self.info is not None else block_idx * self.chunk_frames

    def frame_size(self, bucket: int) -> tuple[int, int]:
        """(height, width) of the frames of ``bucket``."""
        return self.info.frame_size(bucket) if self.info is not None else (bucket, bucket)

    def live(self, sid: str) -> Live | None:
        return self._live.get(sid)

    def utilisation(self) -> float:
        return self.engine.scheduler.utilisation() if self.engine is not None else 0.0

    def counts(self) -> tuple[dict[str, int], dict[int, int]]:
        by_state = {
            "active": self.store.active_count,
            "detached": self.store.detached_count,
        }
        by_level = Counter(live.level for live in self._live.values() if live.peer is not None)
        return by_state, dict(by_level)

    def load(self) -> dict[str, Any]:
        ok, why = self.readiness()
        cap = self.store.capacity
        return {
            "state": "draining" if self.draining else self.phase.value,
            "ready": ok,
            "reason": why,
            "sessions": len(self.store),
            "active": self.store.active_count,
            "detached": self.store.detached_count,
            "capacity": cap,
            "free": max(0, cap - self.store.active_count),
            "utilisation": round(self.utilisation(), 4),
            "buckets": list(self.buckets),
        }

    # --- internals ---

    def _model_full(self, verdict: Admission) -> ModelFull:
        return ModelFull(verdict, self.settings.admission_threshold, self.store.capacity)

    def _schedule(
        self,
        engine: Engine,
        live: Live,
        first_block: int,
        *,
        observation: np.ndarray | None = None,
        restore: ModelState | None = None,
    ) -> Admission:
        """Add the session to the engine (from ``restore`` when resuming)."""
        req = live.request
        spec = SessionSpec(live.sid, req.bucket, req.seed, live.scene, observation, restore)
        kw: dict[str, Any] = dict(
            fps=req.fps, lookahead=req.lookahead, mode=Mode(req.mode), first_block=first_block
        )
        verdict = engine.add_session(live.sid, spec, **kw)
        if (
            verdict.admitted
            and verdict.settings is not None
            and restore is not None
            and verdict.settings.bucket != restore.bucket
        ):  # admitted at another bucket than the state's: resize the state's frames
            engine.remove_session(live.sid)  # not opened yet: nothing reaches the runner
            moved = rebucket(restore, verdict.settings.bucket)
            verdict = engine.add_session(live.sid, replace(spec, restore=moved), **kw)
        if verdict.admitted and verdict.settings is not None:
            live.level, live.settings = verdict.level, verdict.settings
            if live.action is not None:
                engine.set_action(live.sid, live.action, live.action_seq)
        return verdict

    def _new_epoch(self, engine: Engine, live: Live) -> None:
        """Block 0 on a live session: the store opens a new epoch, the model starts afresh."""
        sid = live.sid
        decision = self.store.open_block(sid, 0, frames=self.block_frames(0))
        if sid in engine.scheduler:
            engine.remove_session(sid)
        if live.pump is not None:
            live.pump.cancel()
            live.pump = None
        live.epoch = decision.epoch
        live.ring.clear()
        live.next_block = 0
        live.restored = None
        verdict = self._schedule(engine, live, 0)
        if not verdict.admitted:
            self.close(sid, "refused")
            raise self._model_full(verdict)
        if live.peer is not None:
            live.pump = asyncio.create_task(self._pump(live, engine.outbox(sid)))
        if live.pull:
            engine.request_block(sid, 0)
        log.info("new epoch", extra={"sid": sid, "epoch": live.epoch})

    def _attach(
        self,
        engine: Engine,
        live: Live,
        peer: Peer,
        reply: Started | Resumed,
        replay: list[Chunk],
    ) -> None:
        live.peer = peer
        peer.attached(reply, live.request.quality or self.settings.jpeg_quality)
        for ch in replay:
            peer.chunk(ch, ordered=True)
        if live.pump is None or live.pump.done():
            live.pump = asyncio.create_task(self._pump(live, engine.outbox(live.sid)))

    def _unbind(self, live: Live) -> None:
        live.peer = None
        if live.pump is not None:
            live.pump.cancel()
            live.pump = None
        if live.action_timer is not None:
            live.action_timer.cancel()
            live.action_timer = None
        live.pending = None

    async def _reap_loop(self) -> None:
        period = min(1.0, self.settings.detached_ttl_s / 2)
        try:
            while True:
                await asyncio.sleep(period)
                try:
                    self.store.reap()
                except Exception:
                    log.exception("reaping detached sessions failed")
        except asyncio.CancelledError:
            pass
