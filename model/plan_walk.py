"""What every model family's runner does with a ``StepPlan`` the same way (session/plan.py).

``execute(plan)`` is, for every family: free the sessions the plan frees, open the new ones
and apply the updates (``prepare``), each guarded so that one session's failure is that
session's error and the rest of the plan still runs (``guarded``); then run the batches,
which is the family's own, and hand each batch's frames out in order (``deliver``). A
cache with no free slot raises ``CacheFull``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from worldserve.session.plan import (
    BatchTiming,
    ChunkResult,
    ChunkWork,
    SessionSpec,
    SessionUpdate,
    StepOutput,
    StepPlan,
)

log = logging.getLogger(__name__)

S = TypeVar("S")


class CacheFull(RuntimeError):
    """No free slot in a KV cache pool."""


def prepare(
    plan: StepPlan,
    out: StepOutput,
    free: Callable[[str], None],
    open_: Callable[[SessionSpec], None],
    update: Callable[[SessionUpdate], None],
) -> None:
    """The plan's frees, opens and updates, in that order, before its batches."""
    for sid in plan.freed:
        free(sid)
    for spec in plan.new_sessions:
        guarded(out, spec.session_id, open_, spec)
    for upd in plan.updates:
        guarded(out, upd.session_id, update, upd)


def deliver(out: StepOutput, bucket: int, steps: int, items: Sequence[ChunkWork], frames: Sequence[np.ndarray],
            seconds: float) -> None:
    """A finished batch: its timing, then each chunk's frames in the batch's order."""
    out.timings.append(BatchTiming(bucket, steps, len(items), seconds))
    for it, fr in zip(items, frames, strict=True):
        out.results.append(ChunkResult(it.session_id, it.block_idx, fr, it.action_seq))


def guarded(out: StepOutput, sid: str, fn: Callable[[Any], None], arg: object) -> None:
    """Run ``fn(arg)`` for session ``sid``; an exception becomes that session's error in
    ``out.errors`` and the rest of the plan still runs."""
    try:
        fn(arg)
    except Exception as exc:  # one session's bad input never fails the plan
        log.warning("session %s: %s", sid, exc)
        out.errors[sid] = str(exc)


def session_state(sessions: Mapping[str, S], session_id: str) -> S:
    """A session's physical state, or a KeyError naming the session."""
    try:
        return sessions[session_id]
    except KeyError:
        raise KeyError(f"runner has no state for session {session_id!r}") from None
