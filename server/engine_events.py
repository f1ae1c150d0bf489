"""What comes back from the engine: chunks on their one way out, scheduler events, step
metrics.

One output path. The engine emits each finished chunk once (``ChunkReady``, through
``on_event``); here it becomes a ``Chunk`` (presentation times, the display frames it was
late by) that goes into the session's replay ring, the blocks a resume re-sends, and on
to the attached peer. A pull chunk goes at once, in order. A push chunk is paced here and
only here: one generated ahead of its display time is held on a timer until then (on the
scheduler's clock, the one the frame clock runs on), then handed over. A push block that
comes late is preceded by one ``skipped`` (the display frames it missed). The peer's
one-slot holder is the only latest-wins holder on the way (server/ws.py,
server/rtc/track.py): it counts the frames it replaces, once, as ``slow_client`` drops.
Held chunks are forgotten when the peer goes or a new epoch starts (they stay in the ring).

``on_event`` also keeps each session's next block, presentation times and degradation
level, commits pull blocks in the store, and tells the peer about degradations and runner
errors; ``on_step`` records step metrics.

``EngineEvents`` is one of the parts ``Service`` (server/service.py) is made of: it works
on the worker's ``Sessions`` and reads the engine through the ``Gate``. A session leaving
the store is handled by ``Sessions`` (server/sessions.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from worldserve.protocol import Degradation, Error, ErrorCode
from worldserve.server.gate import Gate
from worldserve.server.live import Chunk, Live, Shape
from worldserve.server.metrics import Metrics
from worldserve.server.sessions import Sessions
from worldserve.session.costmodel import Drift
from worldserve.session.degrade import DegradationChanged
from worldserve.session.errors import SessionError
from worldserve.session.plan import StepOutput, StepPlan
from worldserve.session.scheduler import ChunkReady, DeadlineMiss, Event, FrameSkipped, RunnerError

log = logging.getLogger("worldserve.service")


class EngineEvents:
    """The engine's callbacks for the worker's sessions; see the module docstring."""

    def __init__(
        self, metrics: Metrics, clock: Callable[[], float], sessions: Sessions, shape: Shape, gate: Gate
    ) -> None:
        self.metrics = metrics
        self.clock = clock  # the scheduler's: display times are on it
        self.sessions = sessions
        self.shape = shape
        self.gate = gate

    def _deliver(self, live: Live, ch: Chunk, display_time: float | None) -> None:
        """A new chunk to the peer: pull at once; push at its display time."""
        if live.peer is None:
            return  # detached: the ring has it for the resume
        delay = 0.0 if display_time is None else display_time - self.clock()
        if delay <= 0:
            self._show(live, ch)
            return

        def fire() -> None:
            live.held.discard(handle)
            self._show(live, ch)

        handle = asyncio.get_running_loop().call_later(delay, fire)
        live.held.add(handle)

    def _show(self, live: Live, ch: Chunk) -> None:
        peer = live.peer
        if peer is None or self.sessions.get(live.sid) is not live:
            return
        peer.chunk(ch, ordered=live.pull)
        live.shown = ch.block_idx

    def _chunk(self, live: Live, ev: ChunkReady, late: int = 0) -> Chunk:
        first = self.shape.block_start(ev.block_idx)
        step = 1e6 / live.settings.fps  # the rate it was made at (admitted, maybe degraded)
        return Chunk(
            live.sid, ev.block_idx, ev.frames, ev.action_seq, first,
            step, time.time(), live.presentation.place(ev.block_idx, first, len(ev.frames), step, late), late,
        )

    def on_event(self, ev: Event) -> None:
        if isinstance(ev, Drift):
            self.metrics.cost_drift.inc()
            return
        live = self.sessions.get(ev.session_id)
        if live is None:
            return
        peer = live.peer
        if isinstance(ev, ChunkReady):
            late = live.late[1] if live.late is not None and live.late[0] == ev.block_idx else 0
            live.late = None
            ch = self._chunk(live, ev, late)
            live.ring.append(ch)
            live.at_block(ev.block_idx + 1)
            if ev.applied is not None and self.sessions.store.peek(live.sid) is live.session:
                live.session.record_block(ev.block_idx, ev.applied, ev.frames)
            if live.pull:
                try:
                    self.sessions.store.commit_block(live.sid, ev.block_idx, len(ev.frames))
                except SessionError as exc:
                    log.warning("store commit: %s", exc, extra={"sid": live.sid})
            self._deliver(live, ch, ev.display_time)
        elif isinstance(ev, FrameSkipped):
            live.skipped += ev.frames
            self.metrics.drops.labels("skipped").inc(ev.frames)
            # told with the late block itself (``_show``), so the client hears of it once,
            # after the block it keeps showing and right before the one that comes late
            before = live.late[1] if live.late is not None and live.late[0] == ev.block_idx else 0
            live.late = (ev.block_idx, before + ev.frames)
        elif isinstance(ev, DeadlineMiss):
            live.misses += 1
            self.metrics.deadline_misses.labels(live.request.mode).inc()
        elif isinstance(ev, DegradationChanged):
            live.at_rung(ev.new_level, ev.settings)
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
                # the exception's text stays in the log: it may name paths, shapes or memory
                peer.send(Error(ErrorCode.RUNNER_ERROR, "the model failed this session's chunk; it is retried"))

    def on_step(self, plan: StepPlan, out: StepOutput, seconds: float) -> None:
        m = self.metrics
        m.plan_latency.observe(seconds)
        for t in out.timings:
            m.step_latency.labels(str(t.bucket)).observe(t.seconds)
            m.batch_size.observe(t.size)
        m.utilisation.set(self.gate.utilisation())
