"""Codec work off the event loop: a small thread pool that the app owns.

The loop thread owns every session's state and must answer sockets and timers within a
millisecond or so; a frame encode (JPEG 0.1-1 ms, H.264 0.7-3 ms from 128 to 512 px) or an
image decode (a PNG observation: ~3 ms at 512 px) on it holds every session back, and
N sessions woken by one engine step hold it N times in a row (``bench/loop_block.py``).
So the WebSocket writer encodes frames here and the observation path decodes images here.
WebRTC needs none of it: aiortc's sender already runs each encode in an executor thread.

Bounded: ``workers`` threads. The queue needs no bound of its own: each connection's writer
waits for its frame before it takes the next, and each connection reads its next message
only once the last one was handled, so at most one job per connection waits here.

The GIL, measured at 128 px (``python -m bench.loop_block --gil``; two threads' throughput
over one): libx264 2.1, Pillow's JPEG decoder 2.0, a 512 px PNG decode 1.7: they release it
for most of their work. Pillow's JPEG encoder (0.9) holds it for the whole encode. A JPEG
encode on a pool thread still frees the loop between frames: the loop waits for one encode
(or the interpreter's 5 ms switch interval while the pool is busy), not for every session's
frames in a row. With 32 sessions at 24 fps on a 2-core box, the loop's p99 stall went from
27-35 ms to 10-16 ms with JPEG and from 197 ms to 7 ms with H.264 (bench/loop_block.py).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def default_workers() -> int:
    """Up to 4 threads, no more than the cores: codec work is short, and more threads than
    cores only queue behind the model thread."""
    return max(1, min(4, os.cpu_count() or 1))


class CodecPool:
    """A bounded thread pool for codec calls; ``open`` and ``close`` belong to the app's
    ``cleanup_ctx`` (server/app.py)."""

    def __init__(self, workers: int | None = None) -> None:
        n = default_workers() if workers is None else workers
        if n < 1:
            raise ValueError(f"codec pool workers must be >= 1, got {workers!r}")
        self.workers = n
        self._executor: ThreadPoolExecutor | None = None

    @property
    def is_open(self) -> bool:
        return self._executor is not None

    def open(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="worldserve-codec")

    async def close(self) -> None:
        """Let the jobs already submitted finish, then stop the threads (waited for on a
        thread of the loop's default executor, not on the loop)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown, True)

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on a pool thread. Cancelling the caller does not stop a
        call already running: the caller must not hand ``fn`` a state that someone else
        uses meanwhile (a connection's encoder is used by its writer task alone)."""
        executor = self._executor
        if executor is None:
            raise RuntimeError("the codec pool is not open (the app's cleanup_ctx opens it)")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, lambda: fn(*args, **kwargs))
