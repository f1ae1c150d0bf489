"""A bounded per-session log of what went into each block, for deterministic replay.

The scheduler reports with each finished block what the runner was given for it
(``Applied``: bucket, steps, the block's actions, a scene or real frames applied just
before it), and the server records that here (``EventLog.record``), so the log holds what
was executed, not what was asked for. Changes only: a held key costs one entry, not one
per block.

Replay contract. One log covers one epoch. Given its ``EpochStart`` (seed, scene,
bucket, steps) and a *complete* event list (``log.complete``: nothing dropped), the inputs
of block ``b`` are:

- actions: those of the last ``ActionEvent`` with ``block_idx <= b`` (zeros and seq 0
  before the first one), ``frames x ACTION_DIM`` floats, row-major;
- scene, bucket, steps: those of the last ``SceneEvent`` / ``SettingsEvent`` with
  ``block_idx <= b``, else the epoch start's;
- observations: the real frames committed into the cache just before block ``b`` was
  generated, oldest first (block 0's: the frame the session was anchored on). Each has
  its SHA-256 digest; the frame itself is kept while the log is in memory (a snapshot
  carries digests only), under a byte budget per log (``frame_bytes``): past it the
  oldest frames are let go and counted (``frames_released``), their digests stay. A
  client streaming large observations so holds at most ``frame_bytes`` of them, however
  long it streams; a log that let frames go replays only from its snapshot's state.

A deterministic runner started from ``seed`` and fed these inputs block by block
reproduces the epoch's frames (``worldserve replay``, model/replay.py); ``EventLog.replay``
yields them, and ``outputs`` holds the digest of each block the runner made, to check the
replay against. Events are appended in non-decreasing ``block_idx`` order. When the log is
full the oldest events are dropped and counted (``dropped``); a log that dropped anything
no longer replays from the seed (``replay`` raises), but its tail still shows what happened
last.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np

DEFAULT_CAPACITY = 1024
MAX_CAPACITY = 65536
DEFAULT_FRAME_BYTES = 32 * 2**20  # observation frames a log keeps, bytes


@dataclass(frozen=True, slots=True)
class EpochStart:
    """What an epoch starts from; never dropped."""

    seed: int
    scene: str
    bucket: int
    steps: int


@dataclass(frozen=True, slots=True)
class ActionEvent:
    block_idx: int  # first block these actions applied to
    seq: int  # the client's sequence number of the newest action folded in
    action: tuple[float, ...]  # the block's (frames, ACTION_DIM) float32 actions, row-major


@dataclass(frozen=True, slots=True)
class SceneEvent:
    block_idx: int  # first block generated with the new scene
    scene: str


@dataclass(frozen=True, slots=True)
class ObservationEvent:
    block_idx: int  # the frame was committed before this block
    digest: str  # SHA-256 hex of the frame's bytes (shape and dtype included)
    frame: np.ndarray | None = field(default=None, compare=False, repr=False)  # (H, W, 3) uint8


@dataclass(frozen=True, slots=True)
class SettingsEvent:
    block_idx: int  # first block generated with these settings
    bucket: int
    steps: int


Event = ActionEvent | SceneEvent | ObservationEvent | SettingsEvent


def digest(arr: np.ndarray) -> str:
    """SHA-256 hex of an array's bytes, its dtype and shape included."""
    a = np.ascontiguousarray(arr)
    return hashlib.sha256(f"{a.dtype.str}{a.shape}".encode() + a.tobytes()).hexdigest()


@dataclass(frozen=True, slots=True)
class Applied:
    """What the runner was given for one block, as the scheduler reports it."""

    bucket: int
    steps: int
    actions: np.ndarray  # (frames, ACTION_DIM) float32
    seq: int
    scene: str | None = None  # a scene applied just before this block
    observations: tuple[np.ndarray, ...] = ()  # real frames committed just before it


@dataclass(frozen=True, slots=True)
class BlockInputs:
    """Everything that went into one block, as ``EventLog.replay`` reconstructs it."""

    block_idx: int
    action: tuple[float, ...]  # empty before the first action: the runner uses zeros
    seq: int
    scene: str
    bucket: int
    steps: int
    observations: tuple[ObservationEvent, ...]  # frames committed just before this block


class EventLog:
    """Bounded log of one epoch: an ``EpochStart`` plus the newest ``capacity`` events."""

    __slots__ = ("_action", "_events", "_framed", "_last_block", "_scene", "_settings", "dropped",
                 "frame_bytes", "frames_held", "frames_released", "outputs", "start")

    def __init__(
        self, start: EpochStart, capacity: int = DEFAULT_CAPACITY, frame_bytes: int = DEFAULT_FRAME_BYTES
    ) -> None:
        if not 1 <= capacity <= MAX_CAPACITY:
            raise ValueError(f"event log capacity must be in [1, {MAX_CAPACITY}], got {capacity}")
        if frame_bytes < 0:
            raise ValueError(f"frame_bytes must be >= 0, got {frame_bytes}")
        self.start = start
        self.dropped = 0  # events pushed out by newer ones
        self.frame_bytes = frame_bytes  # the budget for observation frames held
        self.frames_held = 0  # bytes of the frames held now, at most frame_bytes
        self.frames_released = 0  # frames let go to stay within the budget (digests kept)
        self._events: deque[Event] = deque(maxlen=capacity)
        self._framed: deque[ObservationEvent] = deque()  # events holding a frame, oldest first
        self._last_block = 0
        # the newest logged values, so that ``record`` logs changes only
        self._action: tuple[float, ...] = ()
        self._scene = start.scene
        self._settings = (start.bucket, start.steps)
        # (block_idx, digest of the frames the runner made), newest ``capacity`` blocks
        self.outputs: deque[tuple[int, str]] = deque(maxlen=capacity)

    @classmethod
    def from_events(
        cls, start: EpochStart, events: Iterable[Event], *, dropped: int, capacity: int,
        frame_bytes: int = DEFAULT_FRAME_BYTES,
    ) -> EventLog:
        """Rebuild a log (from a snapshot); raises ValueError on out-of-order events."""
        if dropped < 0:
            raise ValueError(f"dropped must be >= 0, got {dropped}")
        log = cls(start, capacity, frame_bytes)
        for event in events:
            log.append(event)
        log.dropped += dropped
        return log

    @property
    def capacity(self) -> int:
        maxlen = self._events.maxlen
        assert maxlen is not None
        return maxlen

    @property
    def last_block_idx(self) -> int:
        """The block_idx of the newest event (0 when empty): the next one may not be lower."""
        return self._last_block

    @property
    def complete(self) -> bool:
        """True while nothing was dropped: the log replays from the seed."""
        return self.dropped == 0

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events)

    def append(self, event: Event) -> None:
        if event.block_idx < self._last_block:
            raise ValueError(
                f"event for block_idx {event.block_idx} after one for block_idx {self._last_block}"
            )
        if len(self._events) == self.capacity:
            self.dropped += 1
            if self._framed and self._framed[0] is self._events[0]:
                self.frames_held -= self._nbytes(self._framed.popleft())
        if isinstance(event, ObservationEvent) and event.frame is not None:
            event = self._hold(event)
        self._events.append(event)
        self._last_block = event.block_idx
        match event:
            case ActionEvent():
                self._action = event.action
            case SceneEvent():
                self._scene = event.scene
            case SettingsEvent():
                self._settings = (event.bucket, event.steps)

    @staticmethod
    def _nbytes(event: ObservationEvent) -> int:
        return 0 if event.frame is None else int(event.frame.nbytes)

    def _hold(self, event: ObservationEvent) -> ObservationEvent:
        """Keep ``event``'s frame if the budget allows, letting the oldest held frames go."""
        size = self._nbytes(event)
        if size > self.frame_bytes:
            self.frames_released += 1
            return replace(event, frame=None)
        while self.frames_held + size > self.frame_bytes:
            old = self._framed.popleft()
            self.frames_held -= self._nbytes(old)
            self.frames_released += 1
            for i, e in enumerate(self._events):  # O(capacity), once per frame let go
                if e is old:
                    self._events[i] = replace(old, frame=None)
                    break
        self._framed.append(event)
        self.frames_held += size
        return event

    def record(self, block_idx: int, applied: Applied, frames: np.ndarray) -> None:
        """Log what block ``block_idx`` was made with (changes only) and its frames' digest."""
        if (applied.bucket, applied.steps) != self._settings:
            self.append(SettingsEvent(block_idx, applied.bucket, applied.steps))
        if applied.scene is not None and applied.scene != self._scene:
            self.append(SceneEvent(block_idx, applied.scene))
        for frame in applied.observations:
            self.append(ObservationEvent(block_idx, digest(frame), frame))
        action = tuple(np.asarray(applied.actions, np.float32).ravel().tolist())
        if action != (self._action or (0.0,) * len(action)):  # zeros before the first one
            self.append(ActionEvent(block_idx, applied.seq, action))
        self.outputs.append((block_idx, digest(frames)))

    def replay(self, num_blocks: int) -> Iterator[BlockInputs]:
        """The inputs of blocks ``0 .. num_blocks - 1``; ValueError if events were dropped."""
        if not self.complete:
            raise ValueError(f"cannot replay from the seed: {self.dropped} events were dropped")
        start = self.start
        action: tuple[float, ...] = ()
        seq, scene, bucket, steps = 0, start.scene, start.bucket, start.steps
        pending = deque(self._events)
        for block in range(num_blocks):
            observations: list[ObservationEvent] = []
            while pending and pending[0].block_idx <= block:
                event = pending.popleft()
                match event:
                    case ActionEvent():
                        action, seq = event.action, event.seq
                    case SceneEvent():
                        scene = event.scene
                    case SettingsEvent():
                        bucket, steps = event.bucket, event.steps
                    case ObservationEvent():
                        observations.append(event)
            yield BlockInputs(block, action, seq, scene, bucket, steps, tuple(observations))
