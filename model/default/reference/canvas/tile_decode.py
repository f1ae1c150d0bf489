"""Canvas tiles decoded to pixels, inline or ahead of the camera on a thread of their own
(issue 38: the world canvas in serving).

A tile's pixels are a pure function of its codes, ``MARGIN`` codes of its neighbours around it
and the session's scene, so a decode made early on another thread gives exactly the pixels one
made when the view reaches the tile. ``GroundPainter`` crops the codes and hands them here; the
model thread then finds the pixels ready instead of spending a tile's decode inside a chunk.

The same thread fills the canvas ahead of the camera (``GroundPainter.prepare``: the prior's
draws, about 1 ms a tile), before any decode. The queue is ordered by urgency: fills, then the
tiles the view covers, then the ring around them.

Where the cores compute side by side (``model/cores.py``: the runner probes it at start-up,
``--canvas-decode auto``) the thread works beside the chunks, on the core the model thread
leaves free. Elsewhere it works only while the model thread is not inside a chunk (``busy``). On the 2-core
Xeon, at one time, the two cores shared their matrix units: a bf16 matmul loop ran 1.8x slower
beside a second one, and a decode running beside a chunk made that chunk twice as long (4
sessions stepped back to back, a key held: 47 ms a chunk that overlapped a decode, 22 ms one
that did not). Hours later ``python -m bench.core_share`` read 1.00 on the same machine: how
much a second thread costs depends on the host's load. In the gaps between chunks a decode
costs the model nothing either way. Work the model thread needs while it is still queued
(``Job.take``) is taken back and done inline, so a chunk never waits behind other sessions'
look-ahead, and a saturated model, which leaves no gaps, does all of it inline.

A tile's pixels are sharpened once decoded (``sharpen``, ``SHARPEN``): the decoder learnt views
rendered at any sub-pixel offset and draws their mean, as soft at whole pixels as the world's
ground a quarter of a pixel off; the view is then sampled from the tile at
the camera's own offset, bilinear, as the renderer samples its ground (docs/model.md, "The
canvas drawn as sharp as the world").

Tiles decode in the runner's dtype (bf16: about 18 ms a tile on one core of a 2-core AVX-512
BF16 EPYC against 24 in float32, half of it the decoder's local norms; within 0.01 of
float32's pixels in [-1, 1]). Every tile decodes alone (a batch of one), inline
or ahead: a convolution's result must not depend on what else shared its batch, or a replay
would differ from the session it replays.
"""

from __future__ import annotations

import atexit
import copy
import heapq
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, Generic, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from worldserve.model.cores import decode_beside_chunks
from worldserve.model.default.reference.canvas.canvas import CODE_UNITS, TILE_UNITS
from worldserve.model.default.reference.canvas.tokenizer import GroundTokenizer

MARGIN = 3  # codes of the neighbours decoded around a tile (the decoder's reach)
BLEND = 8  # pixels of the margin kept around a tile's pixels, where it blends into its neighbours
SHARPEN = 1.0  # the served unsharp mask's amount (``sharpen``; 0: the decoder's pixels as drawn)
DECODE_MODES = ("auto", "between", "beside")  # where the decoder's thread works (``beside_chunks``)
T = TypeVar("T")
log = logging.getLogger("worldserve.canvas")


@dataclass(slots=True)
class DecodeCounts:
    """Where the decoder's work was done, for the serving bench's breakdown: on its thread
    (``ahead``: fills and decodes; of those, ``waited`` were still running when the model thread
    needed them, with the seconds it waited), or on the model thread: decodes (``inline``, with
    the seconds they cost there: taken back from the queue, or never queued) and fills
    (``inline_fills``, the prior's draws around the view, taken back from the queue)."""

    ahead: int = 0
    inline: int = 0
    inline_s: float = 0.0
    waited: int = 0
    waited_s: float = 0.0
    inline_fills: int = 0
    inline_fills_s: float = 0.0

    def copy(self) -> DecodeCounts:
        return DecodeCounts(*(getattr(self, f.name) for f in fields(self)))

    def since(self, before: DecodeCounts) -> DecodeCounts:
        return DecodeCounts(*(getattr(self, f.name) - getattr(before, f.name) for f in fields(self)))

    def line(self, seconds: float) -> str:
        """The counts over ``seconds`` of wall time, times in ms a second (the benches' breakdown)."""
        ms = 1e3 / seconds
        return (f"ahead {self.ahead} waited {self.waited} ({self.waited_s * ms:.1f} ms/s) inline {self.inline} "
                f"({self.inline_s * ms:.1f} ms/s) fills inline {self.inline_fills} "
                f"({self.inline_fills_s * ms:.1f} ms/s)")


@dataclass(frozen=True, slots=True)
class Job(Generic[T]):
    """Work handed to the decoder's thread."""

    future: Future[T]
    work: Callable[[], T]
    counts: DecodeCounts | None = None
    fill: bool = False  # counted as a fill (else a decode) where it is done inline
    urgency: int = 0  # its place in the decoder's queue (``TileDecoder.run``)

    def take(self) -> T:
        """The work's result: done here if it has not started on the decoder's thread."""
        c = self.counts
        if self.future.cancel():
            t0 = time.perf_counter()
            out = self.work()
            if c is not None and self.fill:
                c.inline_fills += 1
                c.inline_fills_s += time.perf_counter() - t0
            elif c is not None:
                c.inline += 1
                c.inline_s += time.perf_counter() - t0
            return out
        if c is None or self.future.done():
            return self.future.result()
        t0 = time.perf_counter()
        out = self.future.result()
        c.waited += 1
        c.waited_s += time.perf_counter() - t0
        return out


_BELL = np.exp(-np.arange(-2.0, 3.0) ** 2 / 2)  # a Gaussian of sigma one pixel, five taps
_TAPS = tuple(float(k) for k in _BELL / _BELL.sum())


def sharpen(img: torch.Tensor, amount: float) -> torch.Tensor:
    """(C, H, W) plus ``amount`` times its difference from a Gaussian blur of it (sigma one
    pixel, edges replicated): an unsharp mask. On true codes 0.5 brings a decode's mean absolute
    Laplacian from 12.5 to 17.7 against the world's 18.5 at whole pixels (16 held-out worlds;
    docs/model.md). The served 1.0 goes past the world's ground on true codes (by 20-30 % at
    whole pixels, 40 % at random sub-pixel places) and meets it in the served frames, whose
    references, drawn from the prior's codes, are softer than a decode of the world's own: at
    1.0 the frames are within a tenth of the world's detail at 2, 10 and 60 s, at 0.75 below
    it at each, and a classifier tells them from the world's less often at 10 and 60 s
    (docs/model.md, "Sharpened by 1.0: served")."""
    if amount == 0:
        return img
    _, h, w = img.shape
    pad = F.pad(img[None], (2, 2, 2, 2), mode="replicate")[0]
    # the taps as shifted slices: 1.5 ms a tile, where grouped convolutions took 2.2-2.7
    rows = sum(k * pad[:, :, i : i + w] for i, k in enumerate(_TAPS))
    blur = sum(k * rows[:, i : i + h] for i, k in enumerate(_TAPS))
    return img + amount * (img - blur)


class TileDecoder:
    def __init__(self, tokenizer: GroundTokenizer, device: torch.device, background: bool = True,
                 dtype: torch.dtype = torch.float32, beside_chunks: bool = False, sharpen: float = SHARPEN):
        """``beside_chunks``: the thread also works while the model thread is inside a chunk
        (where the cores compute side by side, ``model/cores.py``); else only between chunks.
        ``sharpen``: the unsharp mask's amount on every decoded tile (``sharpen``)."""
        if not 0 <= sharpen < float("inf"):
            raise ValueError(f"canvas sharpen {sharpen} must be a finite number >= 0")
        self.beside_chunks = beside_chunks
        self.sharpen = sharpen
        self.net = tokenizer if dtype == torch.float32 else copy.deepcopy(tokenizer).to(dtype)
        self.device = device
        self.dtype = dtype
        self._queue: list[tuple[int, int, Future[Any], Callable[[], Any], int]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._idle = threading.Event()  # clear while the model thread is inside a chunk
        self._idle.set()
        self._closed = False
        self.counts = DecodeCounts()  # read by the model thread's side (GIL-atomic increments)
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._serve, name="canvas-decode", daemon=True)
            self._thread.start()
            _LIVE.add(self)

    def decode(self, codes: np.ndarray, scene: np.ndarray) -> torch.Tensor:
        """``codes`` (TILE + 2 MARGIN)² int64 (the tile and its margin), ``scene`` (S,) ->
        the tile's pixels and ``BLEND`` pixels around them (3, TILE_UNITS + 2 BLEND,
        TILE_UNITS + 2 BLEND) float32 in about [-1, 1]."""
        with torch.inference_mode():
            ids = torch.from_numpy(codes)[None].to(self.device)
            sc = torch.from_numpy(np.asarray(scene, np.float32))[None].to(self.device, self.dtype)
            img = sharpen(self.net.decode(ids, sc)[0].float(), self.sharpen)
            m = MARGIN * CODE_UNITS - BLEND
            return img[:, m : m + TILE_UNITS + 2 * BLEND, m : m + TILE_UNITS + 2 * BLEND].contiguous()

    def decode_now(self, codes: np.ndarray, scene: np.ndarray) -> torch.Tensor:
        """``decode`` here, on the thread that needs it now, counted as inline work."""
        t0 = time.perf_counter()
        out = self.decode(codes, scene)
        self.counts.inline += 1
        self.counts.inline_s += time.perf_counter() - t0
        return out

    def submit(self, codes: np.ndarray, scene: np.ndarray, urgency: int = 1) -> Job[torch.Tensor]:
        """``decode`` on the decoder's thread (``run``); the caller keeps the arrays unchanged."""
        return self.run(lambda: self.decode(codes, scene), urgency)

    def run(self, work: Callable[[], T], urgency: int = 0, fill: bool = False) -> Job[T]:
        """``work()`` on the decoder's thread, lowest ``urgency`` first, then in order of
        submission, in the gaps between chunks (inline, done on return, where it has no thread);
        ``fill``: counted as a fill, not a decode (``DecodeCounts``)."""
        fut: Future[T] = Future()
        if self._thread is None:
            fut.set_result(work())
            return Job(fut, work, urgency=urgency)  # no thread: nothing to count
        with self._wake:
            if self._closed:
                raise RuntimeError("the tile decoder is closed")
            heapq.heappush(self._queue, (urgency, next(self._order), fut, work, torch.get_num_threads()))
            self._wake.notify()
        return Job(fut, work, self.counts, fill, urgency)

    @contextmanager
    def busy(self) -> Iterator[None]:
        """The model thread is making a chunk: the decoder's thread starts nothing new
        (unless it works beside chunks)."""
        if self.beside_chunks:
            yield
            return
        self._idle.clear()
        try:
            yield
        finally:
            self._idle.set()

    def close(self) -> None:
        """Stop the thread; work still queued is cancelled."""
        with self._wake:
            self._closed = True
            for item in self._queue:
                item[2].cancel()
            self._queue.clear()
            self._wake.notify()
        self._idle.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _serve(self) -> None:
        while True:
            self._idle.wait()
            with self._wake:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                if not self._idle.is_set():
                    continue  # a chunk began while the queue was empty
                _, _, fut, work, threads = heapq.heappop(self._queue)
            if not fut.set_running_or_notify_cancel():
                continue  # the model thread took it back
            # intra-op threads are set per thread: the same count as the submitting thread's
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            try:
                out = work()
            except BaseException as exc:  # handed to whoever waits on the work
                fut.set_exception(exc)
            else:
                self.counts.ahead += 1  # before the result: whoever waits sees it counted
                fut.set_result(out)


def beside_chunks(mode: str, device: torch.device, dtype: torch.dtype) -> bool:
    """``mode`` (``DECODE_MODES``) as the decoder's ``beside_chunks``: ``auto`` probes a CPU's
    cores (``model/cores.py``, a third of a second) and keeps a GPU's decodes between chunks
    (they would queue on the same device)."""
    if mode not in DECODE_MODES:
        raise ValueError(f"canvas decode mode {mode!r}: one of {', '.join(DECODE_MODES)}")
    if mode != "auto":
        return mode == "beside"
    if device.type != "cpu":
        return False
    beside, ratio = decode_beside_chunks(dtype)
    log.info("canvas tiles decode %s chunks (a second thread's matmuls ran %.2fx slower)",
             "beside" if beside else "between", ratio)
    return beside


_LIVE: weakref.WeakSet[TileDecoder] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Let every decoder's thread finish its work before the interpreter goes: a daemon
    thread stopped inside a torch kernel aborts the process."""
    for decoder in list(_LIVE):
        decoder.close()
