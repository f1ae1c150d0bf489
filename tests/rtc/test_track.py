"""The video track: latest frame wins, a chunk's frames one period apart, 90 kHz pts from
the frame index."""

from __future__ import annotations

import asyncio
from fractions import Fraction

import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError

from worldserve.server.rtc.track import SessionVideoTrack
from worldserve.server.service import Chunk


def chunk(first_frame: int, frames: int = 1, value: int | None = None, seq: int = 0) -> Chunk:
    arr = np.zeros((frames, 8, 8, 3), np.uint8)
    for i in range(frames):
        arr[i] = (first_frame + i) % 256 if value is None else value
    return Chunk("s", first_frame // frames, arr, seq, first_frame, 1e6 / 24, 0.0, round(first_frame * 1e6 / 24))


class FakeTime:
    """A monotonic clock that ``sleep`` advances (no real waiting)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def value(frame: object) -> int:
    return int(frame.to_ndarray(format="rgb24")[0, 0, 0])  # type: ignore[attr-defined]


async def test_pts_count_frame_indices_at_90khz_and_never_go_back() -> None:
    t = FakeTime()
    track = SessionVideoTrack(24.0, clock=t.clock, sleep=t.sleep)
    pts = []
    for first in (0, 1, 2, 5, 0, 1):  # a gap (3, 4 skipped), then a new epoch
        track.put(chunk(first))
        f = await track.recv()
        assert f.time_base == Fraction(1, 90_000)
        pts.append(f.pts)
    assert pts == [0, 3750, 7500, 18750, 22500, 26250]


async def test_a_rate_change_keeps_timestamps_continuous() -> None:
    t = FakeTime()
    track = SessionVideoTrack(24.0, clock=t.clock, sleep=t.sleep)
    track.put(chunk(10))
    assert (await track.recv()).pts == 37500
    track.set_rate(12.0)  # degraded: each frame now lasts two 24 fps frames
    track.put(chunk(11))
    assert (await track.recv()).pts == 37500 + 7500


async def test_the_latest_chunk_wins_and_replaced_frames_are_counted() -> None:
    t = FakeTime()
    track = SessionVideoTrack(24.0, clock=t.clock, sleep=t.sleep)
    for first in (0, 1, 2):
        track.put(chunk(first))
    assert track.queued == 1
    assert value(await track.recv()) == 2
    assert track.dropped == 2 and track.frames_sent == 1 and track.queued == 0


async def test_frames_of_a_chunk_go_out_one_period_apart_on_the_monotonic_clock() -> None:
    t = FakeTime()
    track = SessionVideoTrack(10.0, clock=t.clock, sleep=t.sleep)
    track.put(chunk(0, frames=3))
    times = []
    for _ in range(3):
        await track.recv()
        times.append(t.now)
    assert np.allclose(np.diff(times), 0.1)
    # The next chunk was handed over at its display time: its first frame goes at once
    # (chunks are paced before the track, server/engine_events.py).
    track.put(chunk(3, frames=1))
    await track.recv()
    assert t.now == times[-1]


async def test_a_newer_chunk_replaces_the_rest_of_an_older_one() -> None:
    t = FakeTime()
    track = SessionVideoTrack(10.0, clock=t.clock, sleep=t.sleep)
    track.put(chunk(0, frames=4))
    assert value(await track.recv()) == 0
    track.put(chunk(4, frames=4))
    assert value(await track.recv()) == 4  # frames 1..3 dropped
    assert track.dropped == 3


async def test_recv_waits_for_a_frame_without_busy_looping() -> None:
    track = SessionVideoTrack(24.0)
    task = asyncio.create_task(track.recv())
    await asyncio.sleep(0.05)
    assert not task.done()
    track.put(chunk(0, value=9))
    assert value(await asyncio.wait_for(task, 1)) == 9


async def test_stop_ends_recv_with_media_stream_error() -> None:
    track = SessionVideoTrack(24.0)
    task = asyncio.create_task(track.recv())
    await asyncio.sleep(0)
    track.stop()
    with pytest.raises(MediaStreamError):
        await asyncio.wait_for(task, 1)
    assert track.readyState == "ended"
    with pytest.raises(MediaStreamError):
        await track.recv()


async def test_on_frame_sees_each_frame_index_sent() -> None:
    seen: list[tuple[int, int]] = []
    t = FakeTime()
    track = SessionVideoTrack(24.0, clock=t.clock, sleep=t.sleep,
                              on_frame=lambda c, i: seen.append((c.action_seq, i)))
    track.put(chunk(0, frames=2, seq=4))
    await track.recv()
    await track.recv()
    assert seen == [(4, 0), (4, 1)]


def test_fps_must_be_positive() -> None:
    with pytest.raises(ValueError, match="fps"):
        SessionVideoTrack(0.0)
