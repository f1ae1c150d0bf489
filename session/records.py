"""The scheduler's own record of one session, and the order it serves them in.

The store's ``Session`` (session/session.py) is the server's view; ``Record`` is what
``Scheduler`` (session/scheduler.py) needs to pace, batch and degrade the session.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from worldserve.session.batching import Item
from worldserve.session.clock import FrameClock
from worldserve.session.degrade import LadderState
from worldserve.session.plan import SessionSpec


@dataclass(slots=True, eq=False)
class Record:
    """The scheduler's own view of one session (the store's Session is someone else's)."""

    sid: str
    spec: SessionSpec  # sent once, when the session opens in the runner
    pull: bool
    ladder: LadderState
    clock: FrameClock  # push pacing; pull sessions use only its fps for load
    next_block: int
    actions: np.ndarray  # (frames_per_chunk, ACTION_DIM) float32, latest action wins
    action_seq: int = 0
    display_slot: int = 0  # the display slot the next block is for (push)
    opened: bool = False
    in_flight: bool = False
    retry_at: float = float("-inf")  # after a runner error: hold its open/update/work until
    release: float = float("-inf")  # push: when the next chunk may start (see _set_release)
    scene: str | None = None  # pending changes, sent as one SessionUpdate
    observation: np.ndarray | None = None
    bucket_dirty: bool = False
    # pull: (block, when its rate lets it start, due), and the rate's next theoretical
    # start (GCRA: requests faster than the admitted fps wait for it)
    requests: deque[tuple[int, float, float]] = field(default_factory=deque)
    pull_tat: float = float("-inf")
    # applied by the runner since the last finished block, for that block's ``Applied``
    applied_scene: str | None = None
    applied_observations: list[np.ndarray] = field(default_factory=list)
    committed: int = 0
    skipped_slots: int = 0
    start_slips: int = 0  # slots its clock moved before the first frame (no frame to repeat)
    misses: int = 0
    errors: int = 0


def edf(it: Item[Record]) -> tuple[float, int, int, int]:
    """Earliest deadline first; on a tie the higher priority, then the most skipped."""
    rec = it.rec
    return (it.due, -rec.ladder.priority, -rec.skipped_slots - rec.start_slips, rec.ladder.order)
