"""What the scheduler reports: the events ``Scheduler.update`` (and ``take_events``) return.

Per session, in order: ``ChunkReady`` for each finished block (in block order),
``FrameSkipped`` when display slots pass with no new chunk, ``DeadlineMiss`` when a block
finished after its deadline, ``RunnerError`` when the runner failed a session's part of a
plan, and ``DegradationChanged`` (session/degrade.py) when the controller moves a session
on its ladder; ``Drift`` (session/costmodel.py) when a batch's real time strays from the
cost model's prediction. ``Event`` is their union.

``SessionStats`` is what ``Scheduler.stats`` reports for one session at a time.

``ChunkReady.applied`` is what went into the block; the server records it in the
session's replay log (session/eventlog.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worldserve.session.costmodel import Drift
from worldserve.session.degrade import DegradationChanged, Rung
from worldserve.session.eventlog import Applied
from worldserve.session.options import Mode

__all__ = [
    "ChunkReady",
    "DeadlineMiss",
    "DegradationChanged",
    "Drift",
    "Event",
    "FrameSkipped",
    "RunnerError",
]


@dataclass(frozen=True, slots=True)
class ChunkReady:
    session_id: str
    block_idx: int
    frames: np.ndarray  # (frames_per_chunk, H, W, 3) uint8
    action_seq: int  # the latest action folded into this chunk
    display_time: float | None  # push: when its first frame is shown (scheduler clock)
    applied: Applied | None = None  # what the runner was given for it (the replay log's)


@dataclass(frozen=True, slots=True)
class FrameSkipped:
    """Display slots passed with no new chunk: the client keeps showing the last one."""

    session_id: str
    block_idx: int  # the next block, which moves to a later slot
    repeat_block_idx: int  # the block the client keeps showing (-1: none yet)
    frames: int  # display frames that got no new frame
    display_time: float  # when the first skipped frame was due on screen


@dataclass(frozen=True, slots=True)
class DeadlineMiss:
    session_id: str
    block_idx: int
    deadline: float  # push: display time; pull: request time + deadline
    finished: float


@dataclass(frozen=True, slots=True)
class RunnerError:
    """The runner failed this session's part of a plan; a failed block is retried."""

    session_id: str
    message: str
    block_idx: int | None = None


Event = ChunkReady | FrameSkipped | DeadlineMiss | DegradationChanged | RunnerError | Drift


@dataclass(frozen=True, slots=True)
class SessionStats:
    mode: Mode
    level: int
    settings: Rung
    next_block: int
    blocks_committed: int
    frames_committed: int
    frames_due: int  # push: frames whose display time has passed (skips included)
    frames_skipped: int
    deadline_misses: int
    errors: int
