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

Scale-out (DESIGN.md §7): checkpoints, hand-offs, ``migrated`` and the adoption of
another worker's handoff on resume live in server/migration.py (``MigrationMixin``, a base
of ``Service``); the directory side lives in server/cluster.py, reached through
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

from server.engine import Engine, Outbox, Suspension
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
from server.protocol import (
    Ack,
    Action,
    Block,
    CloseCode,
    Degradation,
    Ended,
    Error,
    ErrorCode,
    Observation,
    Prompt,
    ProtocolError,
    Resume,
    Resumed,
    Skipped,
    Start,
    Started,
)
from server.settings import Settings
from session.admission import Admission
from session.costmodel import CostModel, Drift
from session.degrade import DegradationChanged
from session.degrade import Settings as Rung
from session.errors import (
    BadToken,
    IllegalTransition,
    SessionError,
    SessionStateMissing,
)
from session.plan import (
    BatchTiming,
    ModelState,
    Runner,
    SessionSpec,
    StepOutput,
    StepPlan,
    encode_action,
)
from session.scheduler import (
    ChunkReady,
    DeadlineMiss,
    Event,
    FrameSkipped,
    Mode,
    RunnerError,
    RunnerInfo,
    Scheduler,
)
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


class Service(MigrationMixin):
    """Sessions of one worker; see the module docstring."""

    def __init__(
        self, settings: Settings, metrics: Metrics, clock: Callable[[], float] = time.monotonic
    ) -> None:
        from session.store import SessionStore

        self.settings = settings
        self.metrics = metrics
        self.clock = clock
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
        info = RunnerInfo(buckets, runner.frames_per_chunk, runner.max_steps, s.warmup_batch_sizes)
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
        self._require_ready()
        if self.draining:
            raise NotReady(Phase.DRAINING, 1.0)
        if self.remote is None:
            return self.open(req, peer)
        await self.remote.admit(req.session_id)
        try:
            started = self.open(req, peer, session_id=req.session_id)
        except BaseException:
            if req.session_id is not None and req.session_id not in self._live:
                self.remote.ended(req.session_id, "refused")  # give the reservation back
            raise
        self.remote.opened(started.session_id, started.epoch)
        return started

    def open(self, req: Start, peer: Peer, *, session_id: str | None = None) -> Started:
        """A new session from a ``start`` message, attached to ``peer`` (with the given id:
        a router's reservation; else a fresh one)."""
        engine = self._require_ready()
        if self.draining:
            raise NotReady(Phase.DRAINING, 1.0)
        if req.bucket not in self.buckets:
            raise ProtocolError(f"bucket {req.bucket} is not served; served: {list(self.buckets)}", "bucket")
        observation = None
        if req.observation is not None:
            try:
                observation = req.observation.decode(self.settings.max_image_pixels)
            except ProtocolError as exc:
                raise ProtocolError(exc.reason, f"observation.{exc.field or 'data'}") from None
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
            decision = self.store.open_block(None, 0, config=config, scene=req.prompt, frames=self.chunk_frames)
            sid, token, epoch = decision.session_id, decision.token or "", decision.epoch
        else:
            if session_id in self.store:
                raise PlacementRequired(f"reservation {session_id!r} is already in use")
            token = secrets.token_urlsafe(24)
            session = Session(config, hash_token(token), session_id=session_id, scene=req.prompt,
                              clock=self.clock)
            session.accept_block(0, self.chunk_frames)
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
        started = Started(
            sid,
            token,
            1,
            req.mode,
            req.codec,
            req.fps,
            live.settings.bucket,
            live.settings.bucket,
            live.settings.bucket,
            self.chunk_frames,
            live.level,
            live.settings.steps,
            live.settings.lookahead,
            live.epoch,
            self.buckets,
        )
        self._attach(engine, live, peer, started, [])
        if live.pull:
            engine.request_block(sid, 0, _seconds(req.deadline_ms))
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
        side = live.settings.bucket
        return Resumed(
            live.sid, block_idx, live.epoch, requested, replayed, r.mode, r.codec, r.fps,
            side, side, self.chunk_frames, live.level, restored_from, gap,
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

    # --- inputs ---

    def action(self, sid: str, msg: Action) -> None:
        live = self._attached(sid)
        if msg.seq <= live.seen_seq:
            self.metrics.actions.labels("stale").inc()
            return
        live.seen_seq = msg.seq
        vec = encode_action(frozenset(msg.keys), (msg.mouse[0], msg.mouse[1]))
        if live.pending is None and live.actions.take():
            self._apply_action(live, msg.seq, vec)
            return
        if live.pending is not None:
            self.metrics.actions.labels("coalesced").inc()
        live.pending = (msg.seq, vec)
        if live.action_timer is None:
            loop = asyncio.get_running_loop()
            live.action_timer = loop.call_later(live.actions.wait_time(), self._flush_action, live)

    def _flush_action(self, live: Live) -> None:
        live.action_timer = None
        if live.pending is None or self._live.get(live.sid) is not live:
            return
        if not live.actions.take():
            loop = asyncio.get_running_loop()
            live.action_timer = loop.call_later(live.actions.wait_time(), self._flush_action, live)
            return
        (seq, vec), live.pending = live.pending, None
        self._apply_action(live, seq, vec)

    def _apply_action(self, live: Live, seq: int, vec: np.ndarray) -> None:
        live.action, live.action_seq = vec, seq
        if self.engine is not None and live.sid in self.engine.scheduler:
            self.engine.set_action(live.sid, vec, seq)
        self.metrics.actions.labels("applied").inc()

    def prompt(self, sid: str, msg: Prompt) -> Ack:
        live = self._attached(sid)
        engine = self._require_ready()
        self.store.get(sid).set_scene(msg.prompt)
        live.scene = msg.prompt
        engine.set_scene(sid, msg.prompt)
        return Ack("prompt", msg.id)

    def observe(self, sid: str, msg: Observation) -> Ack:
        self._attached(sid)
        engine = self._require_ready()
        try:
            frame = msg.image.decode(self.settings.max_image_pixels)
        except ProtocolError as exc:
            raise ProtocolError(exc.reason, f"image.{exc.field or 'data'}") from None
        self.store.get(sid).observe(frame)
        engine.observe(sid, frame)
        return Ack("observation", msg.id)

    def block(self, sid: str, msg: Block) -> None:
        """Pull mode: a block request, under the store's block_idx rules."""
        live = self._attached(sid)
        engine = self._require_ready()
        if not live.pull:
            raise ProtocolError(
                "block requests are for pull-mode sessions", "block_idx", ErrorCode.WRONG_MODE
            )
        n = msg.block_idx
        if n == 0:
            self._new_epoch(engine, live)
            return
        session = self.store.get(sid)
        outstanding = session.last_block_idx + 1 - live.next_block
        if n == session.last_block_idx + 1 and outstanding >= self.settings.pull_queue:
            raise ProtocolError(
                f"{outstanding} blocks are already outstanding (at most "
                f"{self.settings.pull_queue}); wait for block {live.next_block}",
                "block_idx",
                ErrorCode.RATE_LIMITED,
            )
        decision = self.store.open_block(sid, n, frames=self.chunk_frames)
        if decision.retransmit:
            ch = live.find(n)
            if ch is not None and live.peer is not None:
                live.peer.chunk(ch, ordered=True)
            return  # not generated yet: it comes when it is
        engine.request_block(sid, n, _seconds(msg.deadline_ms))

    # --- queries ---

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

    def _attached(self, sid: str) -> Live:
        live = self._live.get(sid)
        if live is None or live.peer is None:
            raise SessionStateMissing(sid)
        return live

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
        decision = self.store.open_block(sid, 0, frames=self.chunk_frames)
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

    async def _pump(self, live: Live, box: Outbox) -> None:
        """Engine outbox -> peer, until the outbox closes or the peer goes."""
        q = box.ordered if live.pull else box.latest
        seen = 0
        try:
            while (ev := await q.get()) is not None:
                if q.drops != seen:
                    self.metrics.drops.labels("outbox").inc(q.drops - seen)
                    live.outbox_drops += q.drops - seen
                    seen = q.drops
                peer = live.peer
                if peer is None:
                    return
                ch = live.find(ev.block_idx) or self._chunk(live, ev)
                peer.chunk(ch, ordered=live.pull)
        except Exception:
            log.exception("frame pump failed", extra={"sid": live.sid})

    def _chunk(self, live: Live, ev: ChunkReady) -> Chunk:
        fpc = self.chunk_frames
        return Chunk(
            live.sid, ev.block_idx, ev.frames, ev.action_seq, ev.block_idx * fpc,
            1e6 / live.request.fps, time.time(),
        )

    def _on_event(self, ev: Event) -> None:
        if isinstance(ev, Drift):
            self.metrics.cost_drift.inc()
            return
        live = self._live.get(ev.session_id)
        if live is None:
            return
        peer = live.peer
        if isinstance(ev, ChunkReady):
            live.ring.append(self._chunk(live, ev))
            live.next_block = ev.block_idx + 1
            if live.pull:
                try:
                    self.store.commit_block(live.sid, ev.block_idx, self.chunk_frames)
                except SessionError as exc:
                    log.warning("store commit: %s", exc, extra={"sid": live.sid})
        elif isinstance(ev, FrameSkipped):
            live.skipped += ev.frames
            self.metrics.drops.labels("skipped").inc(ev.frames)
            if peer is not None:
                peer.send(Skipped(ev.block_idx, ev.repeat_block_idx, ev.frames))
        elif isinstance(ev, DeadlineMiss):
            live.misses += 1
            self.metrics.deadline_misses.labels(live.request.mode).inc()
        elif isinstance(ev, DegradationChanged):
            live.level, live.settings = ev.new_level, ev.settings
            up = "down" if ev.new_level > ev.old_level else "up"
            self.metrics.degradations.labels(up).inc()
            s = ev.settings
            if peer is not None:
                peer.send(
                    Degradation(ev.old_level, ev.new_level, ev.changes, s.fps, s.bucket, s.steps, s.lookahead)
                )
            log.info("degradation", extra={"sid": live.sid, "ladder_level": ev.new_level,
                                           "changes": ",".join(ev.changes)})
        elif isinstance(ev, RunnerError):
            self.metrics.runner_errors.inc()
            log.warning("runner error: %s", ev.message, extra={"sid": live.sid})
            if peer is not None:
                peer.send(Error(ErrorCode.RUNNER_ERROR, ev.message[:1000]))

    def _on_step(self, plan: StepPlan, out: StepOutput, seconds: float) -> None:
        m = self.metrics
        m.plan_latency.observe(seconds)
        for t in out.timings:
            m.step_latency.labels(str(t.bucket)).observe(t.seconds)
            m.batch_size.observe(t.size)
        m.utilisation.set(self.utilisation())

    def _disposed(self, session: Any) -> None:
        """Store hook: a session object left the store (closed, evicted, expired, new epoch)."""
        sid = session.id
        if sid in self.store:
            return  # a new epoch replaced it; whoever opened the epoch handles the engine
        live = self._live.pop(sid, None)
        if live is None:
            return
        reason = live.end_reason
        if reason is None:
            reason = "evicted" if self.store.evicted != self._evicted_seen else "expired"
        self._evicted_seen = self.store.evicted
        peer = live.peer
        self._unbind(live)
        if self.engine is not None and sid in self.engine.scheduler:
            self.engine.remove_session(sid)
        if peer is not None:
            code = CloseCode.GOING_AWAY if reason in ("shutdown", "migrated") else CloseCode.NORMAL
            peer.end(Ended(sid, reason), code)
        if self.remote is not None:
            self.remote.ended(sid, reason)
        self.metrics.sessions_ended.labels(reason).inc()
        log.info("session ended", extra={"sid": sid, "reason": reason})

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


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0
