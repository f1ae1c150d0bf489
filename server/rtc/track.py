"""The server's video track: a session's frames as an aiortc ``MediaStreamTrack``.

The transport (``RtcPeer.chunk``) puts each finished chunk into a one-slot holder, the
only latest-wins holder on the way out (a newer chunk replaces one not yet taken, and the
replaced frames are counted as drops, ``on_drop``; nothing queues). ``recv()`` is
aiortc's pull: it awaits the holder and never does model work. Chunks are paced in one
place, before they get here: the service hands a push chunk over at its display time
(server/engine_events.py). The track sends a chunk's first frame as soon as it arrives
and its next ones one frame period apart on ``time.monotonic()`` (frame i of a chunk is
displayed i periods after its first). A newer chunk that arrives while the frames of an
older one are still going out wins: the rest of the older one is dropped.

Timestamps: ``pts`` count the frame index on a 90 kHz clock (``time_base`` 1/90000):
the first frame's pts is ``round(index * 90000 / fps)`` and each next one adds
``(index - last index) * 90000 / fps``, so a skipped frame leaves a gap and the receiver
keeps real time. ``fps`` is the session's current rate (``set_rate`` on a degradation), so
a rate change does not make the timestamps jump; a new epoch or a resume (the index back
at or below the last one) advances one frame: RTP timestamps never go backwards.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from fractions import Fraction

import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError
from av import VideoFrame

from worldserve.server.live import Chunk

VIDEO_CLOCK_RATE = 90_000
TIME_BASE = Fraction(1, VIDEO_CLOCK_RATE)


class _Slot:
    """A one-slot holder: ``put`` replaces what is there; ``await get()`` returns None
    once closed."""

    def __init__(self) -> None:
        self.item: Chunk | None = None
        self._ready = asyncio.Event()
        self._closed = False

    def put(self, item: Chunk) -> None:
        if not self._closed:
            self.item = item
            self._ready.set()

    async def get(self) -> Chunk | None:
        while self.item is None:
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        item, self.item = self.item, None
        return item

    def __len__(self) -> int:
        return self.item is not None

    def close(self) -> None:
        self._closed = True
        self._ready.set()


class SessionVideoTrack(MediaStreamTrack):
    """One session's video; see the module docstring."""

    kind = "video"

    def __init__(
        self,
        fps: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_frame: Callable[[Chunk, int], None] | None = None,
        on_drop: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__()
        if not fps > 0:
            raise ValueError(f"fps must be > 0, got {fps!r}")
        self.fps = fps
        self._clock = clock
        self._sleep = sleep
        self.on_frame = on_frame  # (chunk, frame index) just before it is returned
        self.on_drop = on_drop  # (frames) replaced by a newer chunk before they were sent
        self._holder = _Slot()
        self._chunk: Chunk | None = None
        self._next = 0  # index into self._chunk.frames of the next frame to send
        self._last_sent: float | None = None  # monotonic time of the last frame returned
        self._last_index: int | None = None
        self._last_pts = 0
        self._held_frames = 0  # frames of the chunk in the holder (0: empty)
        self.frames_sent = 0
        self.dropped = 0  # frames that a newer chunk replaced before they were sent

    # --- producer side (the event loop, from RtcPeer) ---

    def put(self, chunk: Chunk) -> None:
        """Hand over a finished chunk (latest wins)."""
        if len(self._holder):  # replaced before recv() took it
            self._drop(self._held_frames)
        self._held_frames = len(chunk.frames)
        self._holder.put(chunk)

    def set_rate(self, fps: float) -> None:
        """The session's frame rate changed (degradation or a resume)."""
        if fps > 0:
            self.fps = fps

    @property
    def queued(self) -> int:
        """Frames waiting to be sent (at most one chunk's)."""
        pending = self._held_frames if len(self._holder) else 0
        if self._chunk is not None:
            pending += len(self._chunk.frames) - self._next
        return pending

    # --- MediaStreamTrack ---

    async def recv(self) -> VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        chunk, i = await self._next_frame()
        index = chunk.first_frame + i
        pts = self._pts(index)
        frame = VideoFrame.from_ndarray(np.ascontiguousarray(chunk.frames[i]), format="rgb24")
        frame.pts = pts
        frame.time_base = TIME_BASE
        self.frames_sent += 1
        if self.on_frame is not None:
            self.on_frame(chunk, index)
        return frame

    def _pts(self, index: int) -> int:
        step = VIDEO_CLOCK_RATE / self.fps
        last = self._last_index
        if last is None:
            pts = round(index * step)
        elif index > last:
            pts = self._last_pts + round((index - last) * step)
        else:  # a new epoch or a resume: one frame on, never back
            pts = self._last_pts + round(step)
        self._last_index, self._last_pts = index, pts
        return pts

    def stop(self) -> None:
        self._holder.close()
        super().stop()

    # --- internals ---

    async def _next_frame(self) -> tuple[Chunk, int]:
        """The next (chunk, frame) to send, at its time on the monotonic clock."""
        period = 1.0 / self.fps
        while True:
            if self._chunk is not None and self._next < len(self._chunk.frames) and not len(self._holder):
                due = (self._last_sent or self._clock()) + period  # the rest of this chunk
            else:
                if self._chunk is not None and self._next < len(self._chunk.frames):
                    self._drop(len(self._chunk.frames) - self._next)  # a newer one is here
                chunk = await self._holder.get()
                if chunk is None:
                    raise MediaStreamError
                self._held_frames = 0
                self._chunk, self._next = chunk, 0
                due = self._clock()  # handed over at its display time: show it now
            wait = due - self._clock()
            if wait > 0:
                await self._sleep(wait)
                if len(self._holder) and self._next > 0:
                    continue  # a newer chunk came while we waited: it wins
            if self.readyState != "live":
                raise MediaStreamError
            assert self._chunk is not None
            i = self._next
            self._next += 1
            self._last_sent = max(self._clock(), due)
            return self._chunk, i

    def _drop(self, frames: int) -> None:
        self.dropped += frames
        if self.on_drop is not None and frames:
            self.on_drop(frames)
