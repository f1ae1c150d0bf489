"""What the runner must be told about the scheduler's sessions, plan by plan.

A plan opens a new session once (its ``SessionSpec``), then carries only changes to a running
one (``SessionUpdate``: a scene, a real frame, a bucket) and the ids whose state to free.
``Changes`` holds what is still to be sent, puts it into the next plan, and when a plan fails
for a session sends it again after a chunk period (``retry``). After a plan ran, ``applied``
keeps the scenes and real frames the runner took, for the ``Applied`` of that session's next
finished block (what its replay log records, session/eventlog.py).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from worldserve.session.plan import SessionUpdate, StepOutput, StepPlan
from worldserve.session.records import Record


class Changes:
    """Sessions to open, changes to send, ids to free (one ``Scheduler``'s)."""

    __slots__ = ("dirty", "freed", "pending_open")

    def __init__(self) -> None:
        self.pending_open: list[Record] = []
        self.dirty: dict[str, Record] = {}
        self.freed: list[str] = []

    def open(self, rec: Record) -> None:
        self.pending_open.append(rec)

    def mark(self, rec: Record) -> None:
        """``rec`` has a pending scene, frame or bucket for the runner."""
        self.dirty[rec.sid] = rec

    def remove(self, rec: Record) -> None:
        self.dirty.pop(rec.sid, None)
        if rec.opened:
            self.freed.append(rec.sid)
        else:
            self.pending_open.remove(rec)

    def next_retry(self) -> float:
        """When the earliest held-back open or change may go (-inf: a free is waiting)."""
        if self.freed:
            return float("-inf")
        pending = (*self.pending_open, *self.dirty.values())
        return min((r.retry_at for r in pending), default=float("inf"))

    def into(self, plan: StepPlan, now: float) -> None:
        """Put what is due into ``plan``: frees first, opens (after their old state is freed),
        then updates."""
        freed = set(self.freed)
        plan.freed, self.freed = self.freed, []
        keep = []
        for rec in self.pending_open:
            if rec.sid in freed or rec.retry_at > now:  # open only after the old state is freed
                keep.append(rec)
                continue
            if rec.observation is not None:  # re-opening: the spec carries everything pending
                rec.spec = replace(rec.spec, observation=rec.observation)
            rec.scene, rec.observation, rec.bucket_dirty = None, None, False
            self.dirty.pop(rec.sid, None)
            plan.new_sessions.append(rec.spec)
            rec.opened = True
        self.pending_open = keep
        if not self.dirty:
            return
        dirty, self.dirty = self.dirty, {}
        for rec in dirty.values():
            if rec.retry_at > now:
                self.dirty[rec.sid] = rec
                continue
            bucket = rec.ladder.settings.bucket if rec.bucket_dirty else None
            plan.updates.append(SessionUpdate(rec.sid, rec.scene, bucket, rec.observation))
            rec.scene, rec.observation, rec.bucket_dirty = None, None, False

    def retry(self, plan: StepPlan, failed: set[str], records: dict[str, Record], now: float) -> None:
        """The runner's state of a failed session is unknown: if this plan opened it, free
        and open it again; if it switched its bucket, switch again; after one chunk period."""
        opened = {spec.session_id for spec in plan.new_sessions}
        rebucket = {u.session_id for u in plan.updates if u.bucket is not None}
        for sid in failed:
            rec = records.get(sid)
            if rec is None:
                continue
            rec.errors += 1
            if sid in opened and rec.opened:
                rec.opened = False
                self.freed.append(sid)
                self.pending_open.append(rec)
            elif sid in rebucket:
                rec.bucket_dirty = True
                self.dirty[sid] = rec
            else:
                continue
            rec.retry_at = now + rec.clock.chunk_period


def note_applied(plan: StepPlan, out: StepOutput, records: dict[str, Record]) -> None:
    """Scenes and real frames the runner applied in ``plan``, kept on each record for its
    next finished block's ``Applied``."""
    changes: list[tuple[str, str | None, np.ndarray | None]] = [
        (spec.session_id, spec.scene, spec.observation)
        for spec in plan.new_sessions if spec.restore is None
    ]
    changes += [(u.session_id, u.scene, u.observation) for u in plan.updates]
    for sid, scene, observation in changes:
        rec = records.get(sid)
        if rec is None or sid in out.errors:
            continue
        if scene is not None:
            rec.applied_scene = scene
        if observation is not None:
            rec.applied_observations.append(observation)
