"""A restored session's canvas, made off the model thread.

A server resuming a session (a client back after a drop, a session migrated in from another
worker) hands its snapshot to ``ModelRunner.ready_restore`` on a worker thread before the
session is scheduled: the canvas is rebuilt from the snapshot there and the tiles its view
reaches first are decoded (``GroundPainter.ready_restore``); ``ReadyRestores`` keeps it until
the model thread restores the session from that very snapshot and adopts it. Rebuilt on the
model thread instead, the first chunk with the restored session decoded its view's tiles
inline while every running session waited (``bench.join_churn --arrive resume``). Tile
pixels follow from the codes alone, so the session makes the same frames either way.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

KEEP = 8  # canvases kept for snapshots not restored yet (a canvas holds ~1 MB of decoded tiles)


class ReadyRestores:
    """Canvases made ahead for snapshots, found again by an object of the snapshot itself
    (its codes array, the one the restore receives); the oldest past ``keep``, and any taken
    for another look, are handed to ``release``."""

    def __init__(self, release: Callable[[Any], None], keep: int = KEEP) -> None:
        self._release = release
        self.keep = keep
        self._kept: OrderedDict[int, tuple[object, Any]] = OrderedDict()  # by id, the state held: its id not reused
        self._lock = threading.Lock()

    def put(self, state: object, ground: Any) -> None:
        with self._lock:
            old = self._kept.pop(id(state), None)
            self._kept[id(state)] = (state, ground)
            dropped = [old[1]] if old is not None else []
            while len(self._kept) > self.keep:
                dropped.append(self._kept.popitem(last=False)[1][1])
        for g in dropped:
            self._release(g)

    def take(self, state: object, fits: Callable[[Any], bool]) -> Any | None:
        """The canvas made for ``state`` where ``fits`` it (forgotten then), else None."""
        with self._lock:
            kept = self._kept.pop(id(state), None)
        if kept is None:
            return None
        if not fits(kept[1]):
            self._release(kept[1])
            return None
        return kept[1]

    def __len__(self) -> int:
        return len(self._kept)
