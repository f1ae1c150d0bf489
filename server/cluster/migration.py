"""Moving sessions between workers: checkpoints, hand-offs and adoption (DESIGN.md §7).

The worker-side half of scale-out that works on the service's sessions; the directory
side (registration, placement, the drain loop, writing handoffs) lives in
server/cluster/agent.py, whose ``WorkerAgent`` holds this ``Migration`` and is the service's
``Remote`` (server/remote.py).

- ``checkpoint`` packages a running session for crash recovery: ``Engine.export`` reads
  its model state between two steps and the session goes on.
- ``hand_off`` suspends a session at a block boundary (nothing in flight; the one suspend a
  dropped connection uses too, ``Sessions.suspend``) and packages it
  with its last ``migrate_replay_blocks`` blocks for a migration; ``migrated`` then tells
  its client where to go and ends it here.
- A resume of a session this worker does not hold is answered from the directory: its
  handoff is *adopted* (installed DETACHED with its suspension, ``Live.adopted`` set to
  the handoff's next block) and the normal resume path (``Service.resume``) runs, except
  that a resume point the handoff cannot serve continues with an honest gap
  (``resumed.gap_blocks``) instead of failing.

``Migration`` works on the parts ``Service`` (server/service.py) is made of: the worker's
``Sessions``, the ``Shape`` and the engine through the ``Gate``. The ``WorkerAgent`` holds it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from worldserve.protocol import Migrate, Resume
from worldserve.server.engine import Suspension
from worldserve.server.gate import Gate
from worldserve.server.limits import TokenBucket
from worldserve.server.live import Chunk, Live, Shape
from worldserve.server.metrics import Metrics
from worldserve.server.sessions import Sessions
from worldserve.server.settings import Settings
from worldserve.session.degrade import Rung
from worldserve.session.errors import BadToken, SessionStateMissing
from worldserve.session.handoff import Handoff, HandoffError, Kind, ReplayBlock
from worldserve.session.plan import ModelState
from worldserve.session.presentation import Presentation
from worldserve.session.session import Session, SessionStatus
from worldserve.session.snapshot import snapshot

log = logging.getLogger("worldserve.service")


class Migration:
    """Checkpoints, hand-offs and adoption of the worker's sessions; see the module
    docstring."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        clock: Callable[[], float],
        sessions: Sessions,
        shape: Shape,
        gate: Gate,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.sessions = sessions
        self.shape = shape
        self.gate = gate

    async def checkpoint(self, sid: str) -> Handoff | None:
        """A running session packaged for crash recovery, read between two engine steps
        (it keeps running); None if it is not running here now."""
        live, engine = self.sessions.get(sid), self.gate.scheduled(sid)
        if live is None or live.handing_off or engine is None:
            return None
        try:
            susp = await engine.export(sid)
        except (KeyError, RuntimeError):  # ended or suspended meanwhile
            return None
        if self.sessions.get(sid) is not live or live.handing_off:
            return None
        return self._package(live, live.with_restored(susp), "checkpoint", 0)

    async def hand_off(self, sid: str) -> Handoff | None:
        """Stop generating the session at a block boundary and package it, with its last
        ``migrate_replay_blocks`` blocks, for another worker; None if it ended. Its client
        stays attached until ``migrated``. Idempotent."""
        live = self.sessions.get(sid)
        if live is None:
            return None
        susp = await self.sessions.suspend(live)
        if susp is None:
            return None
        live.handing_off = True
        return self._package(live, susp, "migration", self.settings.migrate_replay_blocks)

    def migrated(self, sid: str, msg: Migrate) -> None:
        """Tell the session's client where it continues, then end it here."""
        live = self.sessions.get(sid)
        if live is None:
            return
        if live.peer is not None:
            live.peer.send(msg)
        self.metrics.migrations.labels("handed_off").inc()
        self.sessions.close(sid, "migrated")

    def _package(self, live: Live, susp: Suspension, kind: Kind, replay: int) -> Handoff:
        session = self.sessions.store.peek(live.sid)
        if session is None:
            raise SessionStateMissing(live.sid)
        state = susp.state
        if state is None:  # never ran in the runner: the target starts it from its spec
            b = susp.settings.bucket
            state = ModelState(b, np.zeros((0, b, b, 3), np.uint8), 0, 0, np.zeros(0, np.uint8), live.scene)
        blocks = [ch for ch in live.ring if ch.block_idx < susp.next_block][-replay:] if replay else []
        return Handoff(
            kind,
            live.sid,
            live.epoch,
            susp.next_block,
            susp.level,
            replace(live.request, observation=None, api_key=None, session_id=None),
            live.action,
            live.action_seq,
            live.seen_seq,
            tuple(ReplayBlock(ch.block_idx, ch.action_seq, ch.frames, ch.pts_us, ch.late_frames) for ch in blocks),
            snapshot(session, state),
            time.time(),
            self._presentation_at(live, susp.next_block),
            live.input_limit.level(),
        )

    def _presentation_at(self, live: Live, next_block: int) -> Presentation:
        """The epoch's pts clock placed at ``next_block``, where the target goes on."""
        first = self.shape.block_start(next_block)
        return Presentation(first, live.presentation.at(first, 1e6 / live.settings.fps))

    def adopt(self, h: Handoff, msg: Resume, token_hash: bytes | None = None) -> None:
        """Install another worker's handoff as a DETACHED session with its suspension, before
        ``msg`` resumes it (``WorkerAgent.adopt`` fetches the handoff from the directory).
        ``token_hash``: the directory record's, newer than the handoff's when the token
        rotated (a resume) after the handoff was written."""
        sid = msg.session_id
        try:
            session, state = h.restore(self.clock)
        except HandoffError as exc:
            log.warning("unusable handoff: %s", exc, extra={"sid": sid})
            self.metrics.migrations.labels("failed").inc()
            raise SessionStateMissing(sid, msg.block_idx) from exc
        if token_hash is not None:
            session.token_hash = token_hash
        if not session.check_token(msg.token, self.settings.max_token_age_s):
            self.metrics.resumes.labels("bad_token").inc()
            raise BadToken(sid)
        k = h.next_block
        if session.config.mode == "pull" and msg.block_idx > k:
            # A crash rewound the model: the store's numbering goes on at the client's block.
            n = msg.block_idx
            session = Session(
                session.config, session.token_hash, session_id=sid, scene=session.scene,
                epoch=session.epoch, status=SessionStatus.DETACHED, clock=self.clock,
                log=session.log, blocks_committed=n,
                last_block_idx=n - 1, frames_due=self.shape.block_start(n), frames_committed=self.shape.block_start(n),
            )
        self.sessions.store.install(session)
        s, req = self.settings, h.request
        fps = self.shape.rate(req.fps)
        rung = Rung(fps, req.lookahead if req.mode == "push" else 0, self.shape.max_steps, state.bucket)
        step_us = 1e6 / fps
        start = self.shape.block_start
        ring = deque(
            (Chunk(sid, r.block_idx, r.frames, r.action_seq, start(r.block_idx), step_us, h.created,
                   round(start(r.block_idx) * step_us) if r.pts_us is None else r.pts_us, r.late)
             for r in h.replay),
            maxlen=max(s.replay_blocks, len(h.replay)),
        )
        live = Live(  # built as the handoff left it: nothing is written into it afterwards
            session, req,
            TokenBucket(s.max_actions_per_s, s.action_burst, self.clock),
            ring, rung, self.clock(),
            # what its costly-input budget had left on the worker it comes from (not a full burst)
            TokenBucket.per_chunk(fps, self.shape.chunk_frames, s.input_burst, self.clock).filled_to(h.inputs),
            level=h.level, next_block=k,
            suspension=Suspension(sid, k, state, h.level, rung),
            action=h.action, action_seq=h.action_seq, seen_seq=h.seen_seq,
            presentation=h.presentation or Presentation(start(k), start(k) * step_us), adopted=k,
        )
        self.sessions.add(live)
        self.metrics.migrations.labels("adopted").inc()
        log.info("session adopted", extra={"sid": sid, "kind": h.kind, "next_block": k,
                                          "replay": len(h.replay)})
