"""Per-session server state and the types shared by the service and its transports.

``Live`` is the server's view of one session (the store's ``Session`` holds its
lifetime, the engine its generation); ``Chunk`` is a generated block as transports see
it; ``Peer`` is what a transport implements to be attached to a session; ``Shape`` is
what the runner makes (block frames, frame sizes, controls).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol

import numpy as np

from worldserve.protocol import Ended, ErrorCode, Resumed, ServerMessage, Start, Started
from worldserve.server.engine import Suspension
from worldserve.server.limits import TokenBucket
from worldserve.session.admission import Admission
from worldserve.session.degrade import Rung
from worldserve.session.errors import AtCapacity, SessionError
from worldserve.session.options import DEFAULT_FPS
from worldserve.session.plan import CONTROLS, ModelState
from worldserve.session.presentation import Presentation
from worldserve.session.scheduler import RunnerInfo
from worldserve.session.session import Session


class Phase(StrEnum):
    WARMING = "warming"  # loading and warming the model
    READY = "ready"
    DRAINING = "draining"  # shutting down: no new sessions
    FAILED = "failed"  # the model did not load or the engine died


class NotReady(Exception):
    """The server cannot take sessions now (warming, draining or failed)."""

    code = ErrorCode.NOT_READY

    def __init__(self, phase: Phase, retry_after: float) -> None:
        self.phase = phase
        self.retry_after = retry_after
        super().__init__(f"server is {phase.value}; retry after {retry_after:g} s")


class BlockUnavailable(SessionError):
    """A resume at a block_idx the server can neither re-send nor generate next."""

    code = "stale_block"

    def __init__(self, session_id: str, got: int, oldest: int, next_block: int) -> None:
        self.session_id = session_id
        self.got = got
        super().__init__(
            f"cannot resume session {session_id!r} at block {got}: blocks {oldest}..{next_block} "
            f"can be sent next (or 0 for a new epoch)"
        )


class ModelFull(AtCapacity):
    """Admission refused: even at the bottom of its ladder the session would overload the
    model (the store may have room). Same wire code as a full store: ``at_capacity``."""

    def __init__(self, verdict: Admission, threshold: float, capacity: int) -> None:
        retry = verdict.retry_after or 5.0
        super().__init__(capacity, retry)
        self.args = (
            f"at capacity: the model is busy (predicted utilisation {verdict.utilisation:.2f} "
            f"with this session at its lowest settings, limit {threshold:g}); retry after "
            f"{retry:g} s",
        )


@dataclass(frozen=True, slots=True, eq=False)
class Chunk:
    """A generated block as transports see it."""

    session_id: str
    block_idx: int
    frames: np.ndarray  # (chunk_frames, H, W, 3) uint8
    action_seq: int
    first_frame: int  # epoch frame index of frames[0]
    pts_step_us: float  # microseconds per frame at the rate it was made at
    t_gen: float  # wall clock when generated
    pts_us: int  # frames[0]'s presentation time (session/presentation.py)
    late_frames: int = 0  # push: display frames before it that got no new picture (skipped)

    def frame_pts(self, i: int) -> int:
        """Presentation time in microseconds of ``frames[i]``."""
        return self.pts_us + round(i * self.pts_step_us)


class Peer(Protocol):
    """A transport attached to one session. Every method returns at once (no I/O wait)."""

    def attached(self, reply: Started | Resumed, quality: int) -> None: ...

    def send(self, msg: ServerMessage) -> None: ...

    def chunk(self, chunk: Chunk, *, ordered: bool) -> None: ...

    def end(self, ended: Ended, code: int) -> None: ...


@dataclass(slots=True, eq=False)
class Live:
    """The server's view of one session: what its transport and the worker keep beside the
    store's ``Session``, which owns the session's lifetime, scene and epoch (read here, never
    copied). docs/architecture.md has the table of which object owns which fact.

    The next block and the rung are the scheduler's (its ``Record``): ``at_block`` and
    ``at_rung`` are their one writer each, called where the scheduler tells them (its
    admission, ``ChunkReady``, ``DegradationChanged``) and when the session leaves the
    schedule (``Sessions.suspend``). A session built from a handoff starts at the handoff's."""

    session: Session  # the store's (session/session.py)
    request: Start  # what the client asked for
    action_limit: TokenBucket  # actions applied at most this fast (the rest coalesce)
    ring: deque[Chunk]
    settings: Rung  # the rung it is served at (``at_rung``)
    opened_at: float
    input_limit: TokenBucket  # prompts, observations and new epochs, about one per chunk period
    level: int = 0  # its ladder level (``at_rung``)
    peer: Peer | None = None
    next_block: int = 0  # the first block not generated in this epoch (``at_block``)
    suspension: Suspension | None = None  # set while detached
    restored: tuple[int, ModelState] | None = None  # (first_block, state) it was resumed from
    suspending: asyncio.Future[None] | None = None
    held: set[asyncio.TimerHandle] = field(default_factory=set)  # push chunks before their display time
    shown: int = -1  # the newest block handed to the peer (what its client shows)
    action: np.ndarray | None = None  # the last applied action and its seq
    action_seq: int = 0
    seen_seq: int = 0
    pending: tuple[int, np.ndarray] | None = None  # the coalesced action waiting for a token
    action_timer: asyncio.TimerHandle | None = None
    skipped: int = 0
    misses: int = 0
    late: tuple[int, int] | None = None  # push: (next block, display frames skipped before it)
    presentation: Presentation = field(default_factory=Presentation)  # the epoch's pts_us clock
    end_reason: str | None = None
    adopted: int | None = None  # restored from another worker's handoff at this block
    handing_off: bool = False  # suspended for a migration: no more generation here
    told_ignored: set[str] = field(default_factory=set)  # input kinds said ignored on this connection
    heard_at: float = -math.inf  # when its client last sent a message (-inf: at opened_at)

    def __post_init__(self) -> None:
        if self.heard_at == -math.inf:
            self.heard_at = self.opened_at

    @property
    def sid(self) -> str:
        return self.session.id

    @property
    def scene(self) -> str:
        return self.session.scene

    @property
    def epoch(self) -> int:
        return self.session.epoch

    @property
    def pull(self) -> bool:
        return self.request.mode == "pull"

    def at_block(self, next_block: int) -> None:
        """The first block not generated in this epoch, as the scheduler has it: the block it
        was admitted at, then one past each ``ChunkReady``."""
        self.next_block = next_block

    def at_rung(self, level: int, settings: Rung) -> None:
        """The ladder level and rung the scheduler serves it at: admitted at, changed by a
        ``DegradationChanged``, or the one it left the schedule at (a ``Suspension``)."""
        self.level, self.settings = level, settings

    def with_restored(self, susp: Suspension) -> Suspension:
        """``susp`` with the state the session was resumed from, if it was not reopened in the
        runner since (that state still holds)."""
        if susp.state is None and self.restored is not None and self.restored[0] == susp.next_block:
            return replace(susp, state=self.restored[1])
        return susp

    def unbind(self) -> None:
        """Its transport is gone: forget the peer, stop sending, drop a pending action."""
        self.peer = None
        self.told_ignored.clear()  # the next connection is told again
        self.drop_held()
        if self.action_timer is not None:
            self.action_timer.cancel()
            self.action_timer = None
        self.pending = None

    def drop_held(self) -> None:
        """Forget the push chunks waiting for their display time (they stay in the ring)."""
        for handle in self.held:
            handle.cancel()
        self.held.clear()

    def find(self, block_idx: int) -> Chunk | None:
        for ch in reversed(self.ring):
            if ch.block_idx == block_idx:
                return ch
        return None


class Shape:
    """What the runner makes (frame sizes, block frames, buckets, controls); the defaults
    until ``set`` is called with a warmed runner's ``RunnerInfo``."""

    def __init__(self) -> None:
        self.buckets: tuple[int, ...] = ()
        self.chunk_frames = 1
        self.max_steps = 1
        self.info: RunnerInfo | None = None
        self.controls = CONTROLS  # what the model takes (``started.controls``)

    def set(self, info: RunnerInfo, buckets: tuple[int, ...], chunk_frames: int, max_steps: int) -> None:
        self.info, self.buckets = info, buckets
        self.chunk_frames, self.max_steps = chunk_frames, max_steps
        self.controls = info.controls

    def block_frames(self, block_idx: int) -> int:
        """Frames of block ``block_idx`` of an epoch (a latent family's block 0 holds fewer)."""
        return self.info.frames_in_block(block_idx) if self.info is not None else self.chunk_frames

    def block_start(self, block_idx: int) -> int:
        """The epoch frame index of block ``block_idx``'s first frame."""
        return self.info.block_start(block_idx) if self.info is not None else block_idx * self.chunk_frames

    def frame_size(self, bucket: int) -> tuple[int, int]:
        """(height, width) of the frames of ``bucket``."""
        return self.info.frame_size(bucket) if self.info is not None else (bucket, bucket)

    def rate(self, asked: float | None) -> float:
        """The frame rate a session runs at: what its client asked for, else the model's (a Wan
        recipe's 16: the rate its authors' videos play at; 24 for a model that names none)."""
        if asked is not None:
            return asked
        return self.info.fps if self.info is not None else DEFAULT_FPS

    def schedule(self, steps: int) -> tuple[str | None, tuple[float, ...]]:
        """The recipe served and the model timesteps a session at ``steps`` runs (``status``)."""
        return (self.info.recipe, self.info.schedule(steps)) if self.info is not None else (None, ())


def rebucket(state: ModelState, bucket: int) -> ModelState:
    """The state's frames resized to ``bucket`` (resuming at another resolution)."""
    from PIL import Image

    frames = np.stack(
        [np.asarray(Image.fromarray(f).resize((bucket, bucket), Image.Resampling.BILINEAR)) for f in state.frames]
    ) if len(state.frames) else np.zeros((0, bucket, bucket, 3), np.uint8)
    return replace(state, bucket=bucket, frames=frames)
