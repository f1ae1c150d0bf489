"""A client that stops reading loses old frames (latest wins) and never grows server
memory; other sessions keep their frame rate meanwhile."""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc

from tests.server.harness import fake_factory, recv, send, serve
from worldserve.protocol import Frame, Start, Started
from worldserve.server.keys import CLOSABLES
from worldserve.server.ws import Connection


async def test_a_client_that_stops_reading_stays_bounded_and_the_other_session_keeps_its_rate() -> None:
    # Frames at full bucket size, raw: 49 KB a frame at 128, 60 fps: ~3 MB/s that the
    # slow client never reads.
    async with serve(runner_factory=fake_factory(per_batch=0.001, frame_side=None)) as s:
        slow = await s.connect()
        await send(slow, Start(fps=60.0, bucket=128, codec="raw", lookahead=0))
        started = await recv(slow)
        assert isinstance(started, Started)
        # from here on the slow client reads nothing

        fast = await s.connect()
        await send(fast, Start(fps=25.0, bucket=64, codec="raw", lookahead=0))
        assert isinstance(await recv(fast), Started)

        conn = next(
            c for c in s.app[CLOSABLES] if isinstance(c, Connection) and c.sid == started.session_id
        )
        await asyncio.sleep(2.0)  # let every buffer between the two ends fill up
        tracemalloc.start()
        try:
            gc.collect()  # measure what is held, not cycles waiting for the collector
            before = tracemalloc.get_traced_memory()[0]
            times: list[float] = []
            worst_queue = 0
            worst_buffer = 0
            t_mid = time.monotonic() + 2.0
            t_end = t_mid + 2.0
            mid = None
            while time.monotonic() < t_end:
                if mid is None and time.monotonic() >= t_mid:
                    gc.collect()
                    mid = tracemalloc.get_traced_memory()[0]
                msg = await recv(fast, timeout=5)
                if isinstance(msg, Frame):
                    times.append(time.monotonic())
                worst_queue = max(worst_queue, conn.queued + conn.queued_control)
                transport = conn.request.transport
                assert transport is not None
                worst_buffer = max(worst_buffer, transport.get_write_buffer_size())
            gc.collect()
            now = tracemalloc.get_traced_memory()[0]
            grown, late_growth = now - before, now - (mid or now)
        finally:
            tracemalloc.stop()

        generated = s.service.live(conn.sid or "").next_block  # type: ignore[union-attr]
        assert generated > 200  # the slow session kept being generated...
        assert conn.drops > 100  # ...and its unsent frames were replaced, not queued
        assert worst_queue <= 1 + 1 + 8  # a frame slot, a status slot, a few events
        assert worst_buffer <= 512 * 1024  # the socket buffer: bounded by aiohttp's drain
        # 12 MB went unread meanwhile; what was allocated is the replay rings turning over
        assert grown < 4 * 1024 * 1024 and late_growth < 512 * 1024
        rate = (len(times) - 1) / (times[-1] - times[0])
        assert rate >= 20.0  # the other session kept ~25 fps

