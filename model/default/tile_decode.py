"""Canvas tiles decoded to pixels, inline or ahead of the camera on a thread of their own
(issue 38: the world canvas in serving).

A tile's pixels are a pure function of its codes, ``MARGIN`` codes of its neighbours around it
and the session's scene, so a decode made early on another thread gives exactly the pixels one
made when the view reaches the tile. ``GroundPainter`` crops the codes on the model thread
(the only thread that writes a canvas) and hands them here; the model thread then finds the
pixels ready instead of spending a tile's decode (about 12 ms in fp32 on one core of a 2-core
Xeon, as long as a whole chunk at one session) inside a chunk, which made chunks late.

The same thread fills the canvas ahead of the camera (``GroundPainter.prepare``: the prior's
draws, about 1 ms a tile), before any decode. The queue is ordered by urgency: fills, then the
tiles the view covers, then the ring around them. A
tile the model thread needs while its decode still waits in the queue is taken back and
decoded inline, so a chunk never waits behind other sessions' look-ahead.

Every tile decodes alone (a batch of one), inline or ahead: a convolution's result must not
depend on what else shared its batch, or a replay would differ from the session it replays.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import numpy as np
import torch

from worldserve.model.default.canvas import CODE_UNITS, TILE_UNITS
from worldserve.model.default.tokenizer import GroundTokenizer

MARGIN = 3  # codes of the neighbours decoded around a tile (the decoder's reach)
T = TypeVar("T")


class TileDecoder:
    def __init__(self, tokenizer: GroundTokenizer, device: torch.device, background: bool = True):
        self.tokenizer = tokenizer
        self.device = device
        self._queue: list[tuple[int, int, Future[Any], Callable[[], Any], int]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._serve, name="canvas-decode", daemon=True)
            self._thread.start()
            _LIVE.add(self)

    def decode(self, codes: np.ndarray, scene: np.ndarray) -> torch.Tensor:
        """``codes`` (TILE + 2 MARGIN)² int64 (the tile and its margin), ``scene`` (S,) ->
        the tile's pixels (3, TILE_UNITS, TILE_UNITS) float32 in about [-1, 1]."""
        with torch.inference_mode():
            ids = torch.from_numpy(codes)[None].to(self.device)
            sc = torch.from_numpy(np.asarray(scene, np.float32))[None].to(self.device)
            img = self.tokenizer.decode(ids, sc)[0]
            m = MARGIN * CODE_UNITS
            return img[:, m : m + TILE_UNITS, m : m + TILE_UNITS].contiguous()

    def submit(self, codes: np.ndarray, scene: np.ndarray, urgency: int = 1) -> Future[torch.Tensor]:
        """``decode`` on the decoder's thread (``run``); the caller keeps the arrays unchanged.
        A decode still queued can be cancelled (``Future.cancel``): a caller that needs the
        pixels now decodes them itself rather than wait behind the queue."""
        return self.run(lambda: self.decode(codes, scene), urgency)

    def run(self, work: Callable[[], T], urgency: int = 0) -> Future[T]:
        """``work()`` on the decoder's thread, lowest ``urgency`` first, then in order of
        submission (inline, done on return, where it has no thread)."""
        fut: Future[T] = Future()
        if self._thread is None:
            fut.set_result(work())
            return fut
        with self._wake:
            if self._closed:
                raise RuntimeError("the tile decoder is closed")
            heapq.heappush(self._queue, (urgency, next(self._order), fut, work, torch.get_num_threads()))
            self._wake.notify()
        return fut

    def close(self) -> None:
        """Stop the thread; decodes still queued are cancelled."""
        with self._wake:
            self._closed = True
            for item in self._queue:
                item[2].cancel()
            self._queue.clear()
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                _, _, fut, work, threads = heapq.heappop(self._queue)
            if not fut.set_running_or_notify_cancel():
                continue  # the caller decoded it itself
            # intra-op threads are set per thread: the same count as the submitting thread's
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            try:
                fut.set_result(work())
            except BaseException as exc:  # handed to whoever waits on the work
                fut.set_exception(exc)


_LIVE: weakref.WeakSet[TileDecoder] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Let every decoder's thread finish its decode before the interpreter goes: a daemon
    thread stopped inside a torch kernel aborts the process."""
    for decoder in list(_LIVE):
        decoder.close()
