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

With ``ready`` the worker thread goes on to make the session's canvas from that ground (its
codes, the prior's fills around them, the view's tiles decoded: ``GroundPainter.ready``) and
``StartViews`` keeps that too; the runner opens the session on it. Made on the model thread,
that work held up every running session's next frame (~0.1-0.3 s on a 2-core CPU,
``bench.join_churn``). A kept canvas whose frame never comes back is handed to ``release``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from worldserve.session.plan import SessionSpec

Views = Callable[[str, int, int], tuple[np.ndarray, np.ndarray]]  # (scene, seed, bucket) -> (frame, ground)
Ready = Callable[[str, int, np.ndarray, bool], Any]  # (scene, seed, frame, as seen) -> the session's canvas, ready


@dataclass(frozen=True, slots=True)
class Kept:
    """What ``StartViews.take`` gives back for a frame it handed out."""

    ground: np.ndarray | None  # the ground alone under the frame (None: a client's observation)
    ready: Any = None  # what ``ready`` made of it (None without)


KEEP = 64  # grounds kept for frames handed out and not yet back (a refused start never returns)
KEEP_READY = 8  # of those, the newest keep what ``ready`` made too (a canvas holds ~1 MB of decoded tiles)


class StartViews:
    """``frame`` (a fresh session's first view) and, with a canvas, ``views`` (that view and
    the ground under it, from one world); ``ready`` and ``release``: see the module's doc."""

    def __init__(self, frame: Callable[[str, int, int], np.ndarray], views: Views | None = None,
                 keep: int = KEEP, ready: Ready | None = None,
                 release: Callable[[Any], None] | None = None, keep_ready: int = KEEP_READY) -> None:
        self._frame = frame
        self.views = views
        self.keep = keep
        self.keep_ready = keep_ready
        self._ready = ready
        self._release = release
        self._kept: OrderedDict[tuple[str, int, int], tuple[np.ndarray, Kept]] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, scene: str, seed: int, bucket: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The view a session the runner opens itself starts on, and its ground (None without a canvas)."""
        return (self._frame(scene, seed, bucket), None) if self.views is None else self.views(scene, seed, bucket)

    def frame(self, scene: str, seed: int, bucket: int) -> np.ndarray:
        """The first frame (thread-safe), its ground (and what ``ready`` made of it) kept for ``take``."""
        frame, ground = self.open(scene, seed, bucket)
        if ground is None:
            return frame
        made = None if self._ready is None else self._ready(scene, seed, ground, False)
        self._keep(scene, seed, bucket, frame, Kept(ground, made))
        return frame

    def keep_observation(self, scene: str, seed: int, bucket: int, observation: np.ndarray) -> None:
        """A client's observation a session is about to start on (thread-safe): what ``ready``
        makes of it as seen, kept for ``take`` (nothing without ``ready``)."""
        if self._ready is not None:
            self._keep(scene, seed, bucket, observation, Kept(None, self._ready(scene, seed, observation, True)))

    def _keep(self, scene: str, seed: int, bucket: int, frame: np.ndarray, kept: Kept) -> None:
        dropped = []
        with self._lock:
            old = self._kept.pop((scene, seed, bucket), None)
            if old is not None:
                dropped.append(old[1])
            self._kept[(scene, seed, bucket)] = (frame, kept)
            while len(self._kept) > self.keep:
                dropped.append(self._kept.popitem(last=False)[1][1])
            made = [k for k, v in self._kept.items() if v[1].ready is not None]  # oldest first
            for key in made[: max(0, len(made) - self.keep_ready)]:  # their canvases go, their grounds stay
                old_frame, old_kept = self._kept[key]
                if old_kept.ground is None:  # a client's observation: nothing else to keep
                    del self._kept[key]
                else:  # in place: the grounds keep their order of eviction
                    self._kept[key] = (old_frame, Kept(old_kept.ground))
                dropped.append(old_kept)
        for k in dropped:
            self._drop(k)

    def take(self, spec: SessionSpec) -> Kept | None:
        """What was kept for the session's observation where it is the frame ``frame`` handed
        out for its scene, seed and bucket (forgotten then); None for any other frame."""
        with self._lock:
            kept = self._kept.pop((spec.scene, spec.seed, spec.bucket), None)
        if kept is None:
            return None
        if spec.observation is None or not np.array_equal(kept[0], spec.observation):
            self._drop(kept[1])
            return None
        return kept[1]

    def _drop(self, kept: Kept) -> None:
        if kept.ready is not None and self._release is not None:
            self._release(kept.ready)
