"""A batch's frames on their way from the decoder to the host (``WanRunner._submit_decode``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


class Decoding:
    """A chunk's frames on their way to the host: ``result()`` gives (F', H, W, 3) uint8 arrays,
    one per session, waiting for the decode stream's event (CUDA) or running a decode that was
    held back until then (``later``: the CPU's overlapped order)."""

    def __init__(self, frames: list[torch.Tensor] | None = None, done: torch.cuda.Event | None = None,
                 later: Callable[[], list[torch.Tensor]] | None = None,
                 leads: list[np.ndarray | None] | None = None) -> None:
        self._frames = frames
        self._done = done
        self._later = later
        self._leads = leads or []  # per session, frames that go out before its decoded ones

    def result(self) -> list[np.ndarray]:
        if self._later is not None:
            self._frames, self._later = self._later(), None
        if self._done is not None:
            self._done.synchronize()
            self._done = None
        assert self._frames is not None
        out = [f.cpu().numpy() for f in self._frames]
        for i, lead in enumerate(self._leads):
            if lead is not None:
                out[i] = np.concatenate((lead, out[i]))
        return out
