"""Canvas tiles decoded to pixels, inline or ahead of the camera on a thread of their own
(issue 38: the world canvas in serving).

A tile's pixels are a pure function of its codes, ``MARGIN`` codes of its neighbours around it
and the session's scene, so a decode made early on another thread gives exactly the pixels one
made when the view reaches the tile. ``GroundPainter`` crops the codes on the model thread
(the only thread that writes a canvas) and hands them here; the model thread then finds the
pixels ready instead of spending a tile's decode (about 12 ms in fp32 on one core of a 2-core
Xeon, as long as a whole chunk at one session) inside a chunk, which made chunks late.

Every tile decodes alone (a batch of one), inline or ahead: a convolution's result must not
depend on what else shared its batch, or a replay would differ from the session it replays.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from worldserve.model.default.canvas import CODE_UNITS, TILE_UNITS
from worldserve.model.default.tokenizer import GroundTokenizer

MARGIN = 3  # codes of the neighbours decoded around a tile (the decoder's reach)


class TileDecoder:
    def __init__(self, tokenizer: GroundTokenizer, device: torch.device, background: bool = True):
        self.tokenizer = tokenizer
        self.device = device
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="canvas-decode") if background else None

    def decode(self, codes: np.ndarray, scene: np.ndarray) -> torch.Tensor:
        """``codes`` (TILE + 2 MARGIN)² int64 (the tile and its margin), ``scene`` (S,) ->
        the tile's pixels (3, TILE_UNITS, TILE_UNITS) float32 in about [-1, 1]."""
        with torch.inference_mode():
            ids = torch.from_numpy(codes)[None].to(self.device)
            sc = torch.from_numpy(np.asarray(scene, np.float32))[None].to(self.device)
            img = self.tokenizer.decode(ids, sc)[0]
            m = MARGIN * CODE_UNITS
            return img[:, m : m + TILE_UNITS, m : m + TILE_UNITS].contiguous()

    def submit(self, codes: np.ndarray, scene: np.ndarray) -> Future[torch.Tensor]:
        """``decode`` on the decoder's thread (inline where it has none); the caller keeps the
        arrays unchanged until the future is done."""
        if self._pool is None:
            done: Future[torch.Tensor] = Future()
            done.set_result(self.decode(codes, scene))
            return done
        return self._pool.submit(self._decode_there, codes, scene, torch.get_num_threads())

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _decode_there(self, codes: np.ndarray, scene: np.ndarray, threads: int) -> torch.Tensor:
        # intra-op threads are set per thread: the same count as the submitting thread's
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return self.decode(codes, scene)
