"""Putting a live session into the engine and onto its peer.

``Admissions`` is what starting, resuming and a new epoch share:

- ``schedule``: add the session to the engine's scheduler from block ``first_block`` (from
  an exported state when resuming). Admission may serve it at a lower rung of the ladder
  (server/settings.py); a state admitted at another bucket than its own is resized
  (``rebucket``) before the runner opens it. The live session takes the block it was admitted
  at and the rung it got.
- ``new_epoch``: block 0 on a running session: the store opens a new epoch, the model
  starts afresh, the replay ring is emptied.
- ``refused``: the ``ModelFull`` error for a verdict that did not admit; ``check``: a start
  refused before any work is done for it (its first frame, a detached session evicted).
- ``started`` and ``resumed``: the reply that tells a client what it was admitted at
  (rate, size, rung, block frames, the controls the model takes).
- ``attach``: bind the peer, send it the reply and the replayed chunks, in order.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np

from worldserve.protocol import Resumed, Start, Started
from worldserve.server.engine import Engine
from worldserve.server.live import Chunk, Live, ModelFull, Peer, Shape, rebucket
from worldserve.server.sessions import Sessions
from worldserve.server.settings import Settings
from worldserve.session.admission import Admission
from worldserve.session.errors import AtCapacity
from worldserve.session.plan import ModelState, SessionSpec
from worldserve.session.scheduler import Mode

log = logging.getLogger("worldserve.service")


class Admissions:
    """A live session into the engine and onto its peer; see the module docstring."""

    def __init__(self, settings: Settings, sessions: Sessions, shape: Shape) -> None:
        self.settings = settings
        self.sessions = sessions
        self.shape = shape

    def refused(self, verdict: Admission) -> ModelFull:
        return ModelFull(verdict, self.settings.admission_threshold, self.sessions.store.capacity)

    def check(self, engine: Engine, req: Start) -> None:
        """Raise what ``schedule`` would for ``req`` now (ModelFull, or AtCapacity when every
        session held is active), changing nothing."""
        store = self.sessions.store
        if store.active_count >= store.capacity:
            raise AtCapacity(store.capacity, store.retry_after_s)
        push = req.mode == "push"
        verdict = engine.scheduler.would_admit(
            req.bucket, fps=self.shape.rate(req.fps), lookahead=req.lookahead if push else 0, mode=Mode(req.mode)
        )
        if not verdict.admitted:
            raise self.refused(verdict)

    def schedule(
        self,
        engine: Engine,
        live: Live,
        first_block: int,
        *,
        observation: np.ndarray | None = None,
        restore: ModelState | None = None,
    ) -> Admission:
        """Add the session to the engine at ``first_block`` (from ``restore`` when resuming);
        admitted, the live session is at that block and the rung it got."""
        req = live.request
        spec = SessionSpec(live.sid, req.bucket, req.seed, live.scene, observation, restore)
        kw: dict[str, Any] = dict(
            fps=self.shape.rate(req.fps), lookahead=req.lookahead, mode=Mode(req.mode), first_block=first_block
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
            live.at_block(first_block)
            live.at_rung(verdict.level, verdict.settings)
            if live.action is not None:
                engine.scheduler.set_action(live.sid, live.action, live.action_seq)
        return verdict

    def new_epoch(self, engine: Engine, live: Live, first_frame: np.ndarray | None = None) -> None:
        """Block 0 on a live session: the store opens a new epoch, the model starts afresh
        (from ``first_frame``, the start frame made beforehand off the model thread, if given)."""
        sid = live.sid
        decision = self.sessions.store.open_block(sid, 0, frames=self.shape.block_frames(0))
        pull_tat = float("-inf")  # the pull rate the last epoch used up stays used up
        if sid in engine.scheduler:
            if live.pull:
                pull_tat = engine.scheduler.pull_tat(sid)
            engine.remove_session(sid)
        live.drop_held()
        live.session = decision.session  # a new epoch is a new Session in the store
        live.ring.clear()
        live.restored = None
        verdict = self.schedule(engine, live, 0, observation=first_frame)
        if not verdict.admitted:
            self.sessions.close(sid, "refused")
            raise self.refused(verdict)
        live.shown = -1
        if live.pull:
            engine.scheduler.carry_pull_tat(sid, pull_tat)
            engine.request_block(sid, 0)
        log.info("new epoch", extra={"sid": sid, "epoch": live.epoch})

    def started(self, live: Live, token: str) -> Started:
        """The reply to a ``start`` admitted as ``live`` (its rung's settings)."""
        req, got, shape = live.request, live.settings, self.shape
        height, width = shape.frame_size(got.bucket)
        return Started(
            live.sid, token, 1, req.mode, req.codec,
            got.fps,  # admitted: the rate its frames are paced at
            got.bucket, width, height, shape.chunk_frames, live.level, got.steps, got.lookahead,
            live.epoch, shape.buckets, shape.block_frames(0), shape.controls,
        )

    def resumed(
        self, live: Live, block_idx: int, replayed: int, restored_from: int = -1, gap: int = 0
    ) -> Resumed:
        """The reply to a ``resume``: from ``block_idx``, ``replayed`` chunks re-sent."""
        requested = -1
        if live.pull:
            session = self.sessions.store.peek(live.sid)
            requested = session.last_block_idx if session is not None else -1
        r, shape = live.request, self.shape
        height, width = shape.frame_size(live.settings.bucket)
        # Every resume (a takeover included) answers here: the token is replaced here, so a
        # token seen once (a log, a shoulder) stops working as soon as its owner resumes.
        token = live.session.rotate_token()
        return Resumed(
            live.sid, block_idx, live.epoch, requested, replayed, r.mode, r.codec, live.settings.fps,
            width, height, shape.chunk_frames, live.level, restored_from, gap,
            shape.block_frames(0), shape.controls, token,
        )

    def attach(self, live: Live, peer: Peer, reply: Started | Resumed, replay: list[Chunk]) -> None:
        """Bind ``peer`` to the session and send it ``reply`` and the replayed chunks."""
        live.peer = peer
        peer.attached(reply, live.request.quality or self.settings.jpeg_quality)
        for ch in replay:  # a late one's ``skipped`` goes again with it (the peer writes it)
            peer.chunk(ch, ordered=True)
        live.shown = live.next_block - 1  # the newest block the peer has (replayed up to it)
