"""Frame clocks: when each chunk of a session is displayed and when it is due.

Push mode (the server paces frames). Frame n is displayed at ``t0 + n / fps``. A chunk of
F frames fills one *slot* of ``chunk_period = F / fps`` seconds; with lookahead L the
chunk for slot s is due L slots before its first frame is displayed::

    slot:      0        1        2        3
    display:   t0       t0+p     t0+2p    t0+3p        p = chunk_period
    due (L=1): t0-p     t0       t0+p     t0+2p

Slots and block indices differ only by skipped slots: a chunk that cannot make its slot
moves to a later one (the client repeats its last frame) and block_idx stays consecutive.
Changing fps re-anchors the clock at a slot, so that slot keeps its display time and the
slots after it are spaced by the new period. A session's first chunk anchors its clock when
it is late: nothing is on screen before it, so there is no frame to miss (the open, a start
frame, an observation or a restore, takes model time the clock could not know of).

A session's first slot may hold another number of frames than the rest (``first_frames``:
a causal VAE's first chunk decodes to fewer frames); slot s then starts at frame
``first_frames + (s - 1) * frames_per_chunk`` and the later slots keep the period.

Pull mode (the client asks for block N): the block is due at the request time plus the
client's deadline, or a default one.
"""

from __future__ import annotations

import math


class FrameClock:
    """Display times and due times of one push-mode session's slots."""

    __slots__ = ("_anchor_slot", "_anchor_time", "_fps", "_period", "_short", "frames_per_chunk", "lookahead")

    def __init__(
        self, t0: float, fps: float, frames_per_chunk: int, lookahead: int = 0, first_frames: int | None = None
    ) -> None:
        if not fps > 0:
            raise ValueError(f"fps must be > 0, got {fps!r}")
        if frames_per_chunk < 1:
            raise ValueError(f"frames_per_chunk must be >= 1, got {frames_per_chunk!r}")
        if lookahead < 0:
            raise ValueError(f"lookahead must be >= 0, got {lookahead!r}")
        if first_frames is not None and first_frames < 1:
            raise ValueError(f"first_frames must be >= 1, got {first_frames!r}")
        self._anchor_slot = 0
        self._anchor_time = t0
        self._fps = fps
        self._period = frames_per_chunk / fps
        self._short = frames_per_chunk - (frames_per_chunk if first_frames is None else first_frames)
        self.frames_per_chunk = frames_per_chunk
        self.lookahead = lookahead

    def frames_before(self, slot: int) -> int:
        """Frames of the slots before ``slot`` (from slot 0)."""
        return slot * self.frames_per_chunk - (self._short if slot > 0 else 0)

    def _frame_at(self, t: float) -> float:
        """The (fractional) frame count from slot 0 displayed at ``t``."""
        return (t - self._anchor_time) * self._fps + self.frames_before(self._anchor_slot)

    @property
    def fps(self) -> float:
        return self._fps

    @property
    def chunk_period(self) -> float:
        return self._period

    def display(self, slot: int) -> float:
        """When the first frame of ``slot`` is displayed."""
        return self._anchor_time + (self.frames_before(slot) - self.frames_before(self._anchor_slot)) / self._fps

    def frame_display(self, frame: int) -> float:
        """When frame ``frame`` (counted in slots' frames, skips included) is displayed."""
        return self._anchor_time + (frame - self.frames_before(self._anchor_slot)) / self._fps

    def due(self, slot: int) -> float:
        """When the chunk for ``slot`` must be ready: L chunk periods before display."""
        return self.display(slot) - self.lookahead * self._period

    def slot_at(self, t: float) -> int:
        """The first slot displayed at or after ``t``."""
        x = self._frame_at(t) / self.frames_per_chunk  # in periods from slot 0
        if x <= 1e-9:
            return math.ceil(x - 1e-9)
        return max(1, math.ceil(x + self._short / self.frames_per_chunk - 1e-9))

    def next_display(self, t: float) -> float:
        """The first display time on this clock's grid at or after ``t``."""
        return self.display(self.slot_at(t))

    def slots_displayed(self, now: float) -> int:
        """How many slots (from slot 0) have started displaying by ``now``."""
        x = self._frame_at(now) / self.frames_per_chunk  # in periods from slot 0
        first = 1 - self._short / self.frames_per_chunk  # slot 1 starts here
        if x < first - 1e-9:
            return max(0, min(0, math.floor(x + 1e-9)) + 1)
        return math.floor(x + self._short / self.frames_per_chunk + 1e-9) + 1

    def anchor(self, slot: int, t: float) -> None:
        """Move the clock so that ``slot`` is displayed at ``t``; the period is unchanged."""
        self._anchor_slot = slot
        self._anchor_time = t

    def retime(self, slot: int, fps: float) -> None:
        """Change the frame rate from ``slot`` on; ``slot`` keeps its display time."""
        if not fps > 0:
            raise ValueError(f"fps must be > 0, got {fps!r}")
        self._anchor_time = self.display(slot)
        self._anchor_slot = slot
        self._fps = fps
        self._period = self.frames_per_chunk / fps


def pull_due(request_time: float, deadline: float | None, default: float) -> float:
    """When a pull-mode block is due: request time + the client's deadline (or ``default``)."""
    wait = default if deadline is None else deadline
    if not wait >= 0:
        raise ValueError(f"pull deadline must be >= 0 seconds, got {wait!r}")
    return request_time + wait


class ManualClock:
    """A clock for tests and simulations: time moves only when told to.

    Pass it where a ``Callable[[], float]`` clock is wanted; give ``advance`` to the fake
    runner as its ``sleep`` so model time passes on this clock.
    """

    __slots__ = ("now",)

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot move a clock back by {seconds!r} s")
        self.now += seconds

    def set(self, t: float) -> None:
        """Jump forward to ``t`` (no-op if ``t`` is in the past)."""
        self.now = max(self.now, t)
