"""A fresh session's first view, and the ground under it, made off the model thread.

A server asks the runner for a fresh session's first frame on a worker thread
(``ModelRunner.first_frame``: the default world renders it in ~0.2 s) and hands it back as the
session's observation, so that the model thread does not render it while the running sessions
wait. With a world canvas, a session the runner starts itself writes the ground alone under
that view into its canvas (no actors, glints, cloud shadows or fog: what the canvas holds);
an observation is encoded as it is, actors and weather included. ``StartViews`` keeps the
ground rendered beside each frame it hands out and gives it back when that very frame returns
as the session's observation, so a session opened through a server starts on the same canvas,
and makes the same frames, as one opened by the runner (a replay, a drill's reference). Any
other observation gets no ground.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from worldserve.session.plan import SessionSpec

Views = Callable[[str, int, int], tuple[np.ndarray, np.ndarray]]  # (scene, seed, bucket) -> (frame, ground)

KEEP = 64  # grounds kept for frames handed out and not yet back (a refused start never returns)


class StartViews:
    """``frame`` (a fresh session's first view) and, with a canvas, ``views`` (that view and
    the ground under it, from one world)."""

    def __init__(self, frame: Callable[[str, int, int], np.ndarray], views: Views | None = None,
                 keep: int = KEEP) -> None:
        self._frame = frame
        self.views = views
        self.keep = keep
        self._kept: OrderedDict[tuple[str, int, int], tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, scene: str, seed: int, bucket: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The view a session the runner opens itself starts on, and its ground (None without a canvas)."""
        return (self._frame(scene, seed, bucket), None) if self.views is None else self.views(scene, seed, bucket)

    def frame(self, scene: str, seed: int, bucket: int) -> np.ndarray:
        """The first frame (thread-safe), its ground kept for ``ground``."""
        frame, ground = self.open(scene, seed, bucket)
        if ground is None:
            return frame
        with self._lock:
            self._kept[(scene, seed, bucket)] = (frame, ground)
            self._kept.move_to_end((scene, seed, bucket))
            while len(self._kept) > self.keep:
                self._kept.popitem(last=False)
        return frame

    def ground(self, spec: SessionSpec) -> np.ndarray | None:
        """The ground under the session's observation where it is the frame ``frame`` handed
        out for its scene, seed and bucket (forgotten then); None for any other frame."""
        with self._lock:
            kept = self._kept.pop((spec.scene, spec.seed, spec.bucket), None)
        if kept is None or spec.observation is None or not np.array_equal(kept[0], spec.observation):
            return None
        return kept[1]
