"""Session lifecycle: the store, the engine and the transports, glued together.

The ``SessionStore`` (session/store.py) decides identity and lifetime: ids and resume
tokens, capacity (refusals carry retry-after), block_idx epochs, detach/resume and the
detached TTL. The ``Engine`` (server/engine.py) generates. A transport (``Peer``: the
WebSocket connection, server/ws.py, or a WebRTC peer, server/rtc/peer.py) is attached to at
most one session at a time and is handed finished chunks and events.

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

``Service`` is made of small parts, each owning its state and given what it uses:

- ``Gate`` (server/gate.py): the phase, the engine once it runs, the directory
  (``remote``) and the drain flag: whether this worker takes sessions.
- ``Sessions`` (server/sessions.py): the store and the ``Live`` table, and how a session
  leaves (the store's ``on_dispose``: out of the engine, ``ended`` to its peer).
- ``Shape`` (server/live.py): what the runner makes (block frames, sizes, controls).
- ``Admissions`` (server/admit.py): a live session into the engine (admitted at a rung of
  the ladder, or refused), a new epoch, and the peer attached with its reply and replay.
- ``Inputs`` (server/inputs.py): client inputs (``action``, ``prompt``, ``observe``,
  pull-mode ``block``).
- ``EngineEvents`` (server/engine_events.py): the engine's callbacks (chunks to the peer,
  scheduler events, step metrics).

``Service`` itself keeps the session lifecycle (start, open, resume, detach, close, new
epochs) and the methods the transports, the app and the cluster agent call. Scale-out
(DESIGN.md §7: checkpoints, hand-offs, adopting another worker's handoff on resume) is the
cluster's (server/cluster/): it works on these parts and is reached through ``remote``
(server/remote.py).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

import numpy as np

from worldserve.protocol import (
    CloseCode,
    Ended,
    ProtocolError,
    Resume,
    Resumed,
    Start,
    Started,
)
from worldserve.server.admit import Admissions
from worldserve.server.engine import Engine, Suspension
from worldserve.server.engine_events import EngineEvents
from worldserve.server.gate import Gate
from worldserve.server.inputs import Inputs, seconds
from worldserve.server.limits import TokenBucket
from worldserve.server.live import (
    BlockUnavailable,
    Chunk,
    Live,
    ModelFull,
    NotReady,
    Peer,
    Phase,
    Shape,
)
from worldserve.server.metrics import Metrics
from worldserve.server.offload import CodecPool
from worldserve.server.prompt_filter import PromptChecks, PromptFilter
from worldserve.server.quotas import Quotas
from worldserve.server.remote import PlacementRequired, Remote
from worldserve.server.sessions import Sessions
from worldserve.server.settings import Settings
from worldserve.session.costmodel import CostModel
from worldserve.session.degrade import Rung
from worldserve.session.errors import BadToken, IllegalTransition, SessionStateMissing
from worldserve.session.plan import BatchTiming, Runner
from worldserve.session.scheduler import RunnerInfo, Scheduler
from worldserve.session.session import Session, SessionConfig, SessionStatus, hash_token
from worldserve.session.store import SessionStore

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
T = TypeVar("T")


class Service:
    """Sessions of one worker; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        *,
        codecs: CodecPool | None = None,
        prompt_checks: PromptChecks | None = None,
    ) -> None:
        """``prompt_checks``: the prompt filter's, loaded beforehand (None: loaded here from
        ``settings``, which reads a file: not on a running event loop)."""
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        codecs = codecs or CodecPool()  # images decode here, off the loop (the app opens it)
        self.gate = gate = Gate()
        self.table = table = Sessions(settings, metrics, clock, gate)
        self.shape = shape = Shape()
        self.admit = admit = Admissions(settings, table, shape)
        checks = prompt_checks if prompt_checks is not None else PromptChecks.from_settings(settings)
        self.prompts = PromptFilter(checks, settings, metrics)  # server/prompt_filter.py
        self.inputs = Inputs(settings, metrics, codecs, table, shape, gate, admit.new_epoch, self.prompts)
        self.events = EngineEvents(metrics, clock, table, shape, gate)
        self.quotas = Quotas(settings.quota_starts_per_s, settings.quota_start_burst, settings.quota_sessions, clock)
        self._reaper: asyncio.Task[None] | None = None
        metrics.track_sessions(table.counts)

    # --- the parts' state, as the app, the transports and the cluster agent read it ---

    @property
    def store(self) -> SessionStore:
        return self.table.store

    @property
    def engine(self) -> Engine | None:
        return self.gate.engine

    @property
    def phase(self) -> Phase:
        return self.gate.phase

    @property
    def failure(self) -> str | None:
        return self.gate.failure

    @property
    def remote(self) -> Remote | None:
        """The shared directory (server/cluster/agent.py), if any."""
        return self.gate.remote

    @remote.setter
    def remote(self, remote: Remote | None) -> None:
        self.gate.remote = remote

    @property
    def draining(self) -> bool:
        """Handing sessions over: no new sessions or resumes here."""
        return self.gate.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.gate.draining = value

    # --- lifecycle ---

    async def start_engine(
        self, runner: Runner, executor: Any, timings: list[BatchTiming], buckets: tuple[int, ...]
    ) -> None:
        """Build the scheduler and engine from a warmed runner and start serving."""
        s = self.settings
        info = RunnerInfo.of(runner, s.warmup_batch_sizes, buckets)
        self.shape.set(info, buckets, runner.frames_per_chunk, runner.max_steps)
        scheduler = Scheduler(info, CostModel(timings, steps_cost=info.steps_cost), self.clock, s.scheduler_options())
        engine = Engine(
            scheduler,
            runner,
            executor=executor,
            batching=s.batching,
            on_event=self.events.on_event,
            on_step=self.events.on_step,
        )
        self.gate.engine = engine
        await engine.start()
        self._reaper = asyncio.create_task(self._reap_loop(), name="worldserve-reaper")
        self.gate.phase = Phase.READY
        log.info("ready", extra={"buckets": list(buckets), "capacity": s.capacity})

    def fail(self, reason: str) -> None:
        self.gate.fail(reason)

    def begin_shutdown(self) -> None:
        """Stop admitting and end every session (their peers are told ``shutdown``)."""
        if self.phase is not Phase.FAILED:
            self.gate.phase = Phase.DRAINING
        for live in self.table:
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
        self.prompts.close()

    @property
    def ready(self) -> bool:
        return self.gate.ready

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

    # --- session start, resume, detach, end ---

    async def start(self, req: Start, peer: Peer, client: tuple[str, ...] = ()) -> Started:
        """``open`` behind the directory: in multi-worker mode the ``start`` must carry a
        reservation the router made on this worker (refused otherwise, and refused while
        the directory cannot be reached rather than serving a session nobody can find).
        ``client``: who the start is charged to (server/quotas.py), checked first; then the
        prompt is screened (server/prompt_filter.py), before anything is made for it."""
        self.gate.require_admitting(1.0)
        self.quotas.take(client, lambda sid: sid in self.table)
        await self.prompts.screen(req.prompt, "start")  # refused: no session, no model time
        engine = self.gate.require_admitting(1.0)  # again: the filter may have taken a while
        started = await self._start(engine, req, peer)
        self.quotas.opened(client, started.session_id)
        return started

    async def _start(self, engine: Engine, req: Start, peer: Peer) -> Started:
        if req.bucket in self.shape.buckets:
            self.admit.check(engine, req)  # before the first frame is made
        if self.remote is None:
            return self.open(req, peer, first_frame=await self._first_frame(engine, req))
        await self.remote.admit(req.session_id)  # the reservation, used up before any work
        try:
            started = self.open(req, peer, session_id=req.session_id, first_frame=await self._first_frame(engine, req))
        except BaseException:
            if req.session_id is not None and req.session_id not in self.table:
                self.remote.ended(req.session_id, "refused")  # give the reservation's slot back
            raise
        self.remote.opened(started.session_id, started.epoch)
        return started

    async def _first_frame(self, engine: Engine, req: Start) -> np.ndarray | None:
        """The start's observation decoded (on the codec pool), or the runner's start frame,
        made off the model thread."""
        first = None
        if req.observation is not None and req.bucket in self.shape.buckets:  # on the codec pool
            first = await self.inputs.decode_image(req.observation, "observation")
            if engine.runner.capabilities.ready_observation:  # the model's work on it (a canvas's ground) here too
                await _off_model_thread(f"a {req.bucket} px session's observation", engine.runner.ready_observation,
                                        req.prompt, req.seed, req.bucket, first)
        elif req.bucket in self.shape.buckets:
            # the start frame (the default world renders ~30 ms of CPU) is made here, on a
            # worker thread, not by the model thread while every running session waits
            first = await _off_model_thread(f"start frame for a {req.bucket} px session", engine.runner.first_frame,
                                            req.prompt, req.seed, req.bucket)
        return first

    def open(
        self, req: Start, peer: Peer, *, session_id: str | None = None, first_frame: np.ndarray | None = None,
    ) -> Started:
        """A new session from a ``start`` message, attached to ``peer`` (with the given id:
        a router's reservation; else a fresh one). ``first_frame``: the request's observation,
        decoded beforehand off the loop, or the runner's start frame for a request without
        one, made beforehand off the model thread."""
        engine = self.gate.require_admitting(1.0)
        buckets = self.shape.buckets
        if req.bucket not in buckets:
            raise ProtocolError(f"bucket {req.bucket} is not served; served: {list(buckets)}", "bucket")
        observation = first_frame
        if req.observation is not None and observation is None:
            raise ValueError("open() takes a start's observation decoded, as first_frame")
        push = req.mode == "push"
        fps = self.shape.rate(req.fps)  # the client's, else the model's
        config = SessionConfig(
            fps=fps,
            bucket=req.bucket,
            steps=self.shape.max_steps,
            lookahead=req.lookahead if push else 0,
            mode=req.mode,
            seed=req.seed,
        )
        self.admit.check(engine, req)  # before the store makes room (evicting a detached session)
        if session_id is None:
            decision = self.store.open_block(None, 0, config=config, scene=req.prompt, frames=self.block_frames(0))
            session, token = decision.session, decision.token or ""
        else:
            if session_id in self.store:
                raise PlacementRequired(f"reservation {session_id!r} is already in use")
            token = secrets.token_urlsafe(24)
            session = Session(config, hash_token(token), session_id=session_id, scene=req.prompt,
                              clock=self.clock)
            session.accept_block(0, self.block_frames(0))
            self.store.install(session)
        sid, s = session.id, self.settings
        live = Live(
            session,
            req,
            TokenBucket(s.max_actions_per_s, s.action_burst, self.clock),
            deque(maxlen=s.replay_blocks),
            Rung(fps, config.lookahead, self.shape.max_steps, req.bucket),
            self.clock(),
            TokenBucket.per_chunk(fps, self.shape.chunk_frames, s.input_burst, self.clock),
        )
        verdict = self.admit.schedule(engine, live, 0, observation=observation)
        if not verdict.admitted:
            self.store.close(sid)  # not in the table yet: nothing else to undo
            raise self.admit.refused(verdict)
        self.table.add(live)
        started = self.admit.started(live, token)
        self.admit.attach(live, peer, started, [])
        if live.pull:
            engine.request_block(sid, 0, seconds(req.deadline_ms))
        self.metrics.sessions_started.labels(req.mode).inc()
        log.info(
            "session started",
            extra={"sid": sid, "mode": req.mode, "codec": req.codec, "fps": fps,
                   "bucket": req.bucket, "ladder_level": live.level},
        )
        return started

    async def authorize(self, msg: Resume) -> None:
        """Check a resume's token before any work is done for it: against the session held
        here, else against the directory's record (no hand-off fetched); BadToken if wrong."""
        session = self.store.peek(msg.session_id)
        if session is not None:
            if not session.check_token(msg.token, self.settings.max_token_age_s):
                self.metrics.resumes.labels("bad_token").inc()
                raise BadToken(msg.session_id)
        elif self.remote is not None:
            await self.remote.authorize(msg.session_id, msg.token)

    async def resume(self, msg: Resume, peer: Peer) -> Resumed:
        """Re-attach a detached session at the client's next block (see the docstring)."""
        self.gate.require_admitting(0.5)  # draining: the router knows where sessions go next
        sid = msg.session_id
        if self.remote is not None:  # a session placed here from another worker: adopted first
            await self.remote.adopt(msg)
        live = self._checked(sid, msg)
        if live.peer is not None and live.peer is not peer:  # take over from a stale connection
            old = live.peer
            old.end(Ended(sid, "replaced"), CloseCode.POLICY)
            await self.disconnected(sid, old)
        if live.suspending is not None:
            await asyncio.shield(live.suspending)
        if msg.block_idx:  # block 0 starts a new epoch: nothing restored
            await self._ready_restore(live)
        engine = self.gate.require_ready()
        live = self._checked(sid, msg)  # it may have ended while we waited
        if live.peer is not None:
            raise IllegalTransition(sid, "attached", "resume")
        susp = live.suspension or Suspension(sid, live.next_block, None, live.level, live.settings)
        n, k = msg.block_idx, susp.next_block
        if n == 0:
            self.store.resume(sid, msg.token)
            live.suspension = None
            self.admit.new_epoch(engine, live)
            reply = self.admit.resumed(live, 0, 0)
            self.admit.attach(live, peer, reply, [])
            if self.remote is not None:
                self.remote.resumed(sid, live.epoch, 0)
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
        verdict = self.admit.schedule(engine, live, k, restore=state)
        if not verdict.admitted:
            self.store.detach(sid)
            self.metrics.resumes.labels("refused").inc()
            raise self.admit.refused(verdict)
        live.suspension = None
        live.restored = (k, state) if state is not None else None
        if live.pull:  # requests accepted before the drop and not generated: ask again
            session = self.store.get(sid)
            for b in range(k, session.last_block_idx + 1):
                engine.request_block(sid, b)
        restored_from, live.adopted = (-1 if live.adopted is None else live.adopted), None
        reply = self.admit.resumed(live, k if gap else n, len(replay), restored_from, gap)
        self.admit.attach(live, peer, reply, replay)
        self.metrics.resumes.labels("ok" if restored_from < 0 else "restored").inc()
        if self.remote is not None:  # the directory's record takes the new token's hash
            self.remote.resumed(sid, live.epoch, k)
        log.info("session resumed", extra={"sid": sid, "block_idx": reply.block_idx,
                                           "replayed": len(replay), "restored_from": restored_from,
                                           "gap_blocks": gap})
        return reply

    async def _ready_restore(self, live: Live) -> None:
        """The model's work on the snapshot a session resumes from (a canvas rebuilt, its
        tiles decoded), done on a worker thread before it is scheduled, not by the model
        thread while every running session waits (``Capabilities.ready_restore``)."""
        state = live.suspension.state if live.suspension is not None else None
        runner = self.gate.engine.runner if self.gate.engine is not None else None
        if state is not None and runner is not None and runner.capabilities.ready_restore:
            await _off_model_thread(f"session {live.sid}: its snapshot's canvas", runner.ready_restore, state)

    def _checked(self, sid: str, msg: Resume) -> Live:
        session = self.store.peek(sid)
        live = self.table.get(sid)
        if session is None or live is None:
            self.metrics.resumes.labels("missing").inc()
            raise SessionStateMissing(sid, msg.block_idx)
        if not session.check_token(msg.token):
            self.metrics.resumes.labels("bad_token").inc()
            raise BadToken(sid)
        return live

    async def disconnected(self, sid: str, peer: Peer) -> None:
        """The peer's connection is gone: detach and suspend (resumable until the TTL)."""
        live = self.table.get(sid)
        if live is None or live.peer is not peer:
            return
        live.unbind()
        if self.phase is not Phase.READY:
            self.close(sid, "shutdown")
            return
        session = self.store.peek(sid)
        if session is None:
            return
        if session.status is SessionStatus.ACTIVE:
            self.store.detach(sid)
        susp = await self.table.suspend(live)  # kept until a resume (a hand-off may have done it)
        if susp is None:
            return
        log.info("session detached", extra={"sid": sid, "next_block": susp.next_block})

    def close(self, sid: str, reason: str) -> bool:
        """End a session for good; its peer (if any) is told ``ended``. False if unknown."""
        return self.table.close(sid, reason)

    def sessions(self) -> list[str]:
        """Ids of the sessions held here (attached or detached)."""
        return self.table.ids()

    # --- queries ---

    def block_frames(self, block_idx: int) -> int:
        """Frames of block ``block_idx`` of an epoch (a latent family's block 0 holds fewer)."""
        return self.shape.block_frames(block_idx)

    def frame_size(self, bucket: int) -> tuple[int, int]:
        """(height, width) of the frames of ``bucket``."""
        return self.shape.frame_size(bucket)

    def live(self, sid: str) -> Live | None:
        return self.table.get(sid)

    def utilisation(self) -> float:
        return self.gate.utilisation()

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
            "buckets": list(self.shape.buckets),
            "schedules": self._schedules(),
        }

    def _schedules(self) -> list[dict[str, Any]]:
        """The schedules the sessions run: recipe, step count, model timesteps, how many sessions."""
        by_steps = Counter(live.settings.steps for live in self.table)
        out = []
        for steps, n in sorted(by_steps.items(), reverse=True):
            recipe, timesteps = self.shape.schedule(steps)
            out.append({"recipe": recipe, "steps": steps, "timesteps": [round(t, 3) for t in timesteps],
                        "sessions": n})
        return out

    # --- internals ---

    def _end_overdue(self) -> None:
        """End attached sessions idle (no input) past ``idle_timeout_s`` and any session
        older than ``max_session_age_s`` (0: no limit)."""
        s, now = self.settings, self.clock()
        for live in list(self.table):
            if s.max_session_age_s and now - live.opened_at > s.max_session_age_s:
                self.close(live.sid, "max_age")
            elif s.idle_timeout_s and live.peer is not None and now - live.heard_at > s.idle_timeout_s:
                self.close(live.sid, "idle")

    async def _reap_loop(self) -> None:
        period = min(1.0, self.settings.detached_ttl_s / 2)
        try:
            while True:
                await asyncio.sleep(period)
                try:
                    self.store.reap()
                    self._end_overdue()
                except Exception:
                    log.exception("reaping detached sessions failed")
        except asyncio.CancelledError:
            pass


async def _off_model_thread(what: str, work: Callable[..., T], *args: object) -> T | None:
    """``work(*args)`` on a worker thread, for the runner; None where it fails (logged): the
    runner then does that work itself, on the model thread, when the session opens."""
    try:
        return await asyncio.get_running_loop().run_in_executor(None, work, *args)
    except Exception:
        log.exception("%s failed off the model thread", what)
        return None
