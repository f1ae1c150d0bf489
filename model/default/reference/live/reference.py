"""The world canvas with its live state, as the runner's ``Reference`` (``reference/base.py``).

Composes the canvas's reference (``canvas/reference.py``), whose every member it passes on
for the ground, with each session's live state (``state.py``): for every frame of a chunk the
state's actors are sampled where the canvas holds the view's tiles whole, step once, and
their channels (``channels.py``) follow the ground's reference, so the network reads
``[ground colours, mask, state channels]``. The state moves on with the chunk (``advance``)
and travels in the family state beside the canvas's entries, so a snapshot, a migration, a
replay or a resume goes on with the same things moving the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
import torch

from worldserve.model.default.reference.canvas.ground import (
    MAP_SIZE,
    VIEW_UNITS,
    GroundPainter,
    SessionGround,
)
from worldserve.model.default.reference.canvas.reference import CanvasReference
from worldserve.model.default.reference.live.bank import LiveBank
from worldserve.model.default.reference.live.state import (
    LiveState,
    channels,
    from_entries,
    spawn_ready,
    step,
    to_entries,
)
from worldserve.model.default.reference.start_views import Kept, StartViews, Views
from worldserve.session.plan import ModelState


@dataclass(slots=True)
class LiveSession:
    ground: SessionGround
    live: LiveState
    pending: LiveState | None = None  # the state at the chunk's last frame, until ``advance``


class LiveReference:
    kind = "canvas"

    def __init__(self, canvas: CanvasReference, bank: LiveBank) -> None:
        self.canvas, self.bank = canvas, bank

    @property
    def painter(self) -> GroundPainter:
        return self.canvas.painter

    def start_views(
        self, frame: Callable[[str, int, int], np.ndarray] | None, views: Views | None,
    ) -> StartViews | None:
        return self.canvas.start_views(frame, views)

    def open(self, seed: int, scene: str) -> LiveSession:
        g = self.canvas.open(seed, scene)
        return LiveSession(g, LiveState(seed=g.seed))

    def adopt(self, kept: Kept | None) -> LiveSession | None:
        g = self.canvas.adopt(kept)
        return None if g is None else LiveSession(g, LiveState(seed=g.seed))

    def write(self, st: LiveSession, frame: np.ndarray, ground: np.ndarray | None) -> None:
        self.canvas.write(st.ground, frame, ground)

    def settle(self, st: LiveSession, newest: torch.Tensor) -> None:
        self.canvas.settle(st.ground, newest)

    def rescene(self, st: LiveSession, scene: str) -> None:
        """The same codes re-skinned keep what moves (the weather is the new scene's); a canvas
        started anew (another biome, vegetation or weather) starts the live state anew too."""
        before = st.ground.canvas
        self.canvas.rescene(st.ground, scene)
        if st.ground.canvas is not before:
            st.live = LiveState(seed=st.live.seed, frame=st.live.frame)

    def resized(self, st: LiveSession, newest: torch.Tensor | None) -> None:
        self.canvas.resized(st.ground, newest)

    def inputs(
        self, states: list[LiveSession], prev: torch.Tensor, actions: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The canvas's references (B, F, 4, H, W) with the live state's channels after them."""
        bucket = prev.shape[-1]
        tops0 = [s.ground.position.copy() for s in states]
        refs, moved = self.canvas.inputs([s.ground for s in states], prev, actions)
        # (B, F, 2) px, as the canvas sums them
        shifts = self.canvas.camera_shift(actions, bucket).float().cpu().numpy()
        out = []
        for s, top0, shift in zip(states, tops0, shifts, strict=True):
            tops = top0 - np.cumsum(shift.astype(np.float64), 0) * (VIEW_UNITS / bucket)
            live, canvas, frames = s.live.copy(), s.ground.canvas, []
            for top in tops:
                t = (float(top[0]) % MAP_SIZE, float(top[1]) % MAP_SIZE)
                spawn_ready(live, self.bank, canvas, t)
                step(live, self.bank, canvas, (t[0] + VIEW_UNITS / 2, t[1] + VIEW_UNITS / 2))
                frames.append(channels(live, self.bank, s.ground.look.weather, t, bucket, MAP_SIZE))
            s.pending = live
            out.append(np.stack(frames))
        state = torch.from_numpy(np.stack(out)).to(refs.device, refs.dtype)  # (B, F, K, H, W)
        return torch.cat((refs, state), 2), moved

    def advance(self, states: list[LiveSession], newest: torch.Tensor, moved: torch.Tensor) -> None:
        self.canvas.advance([s.ground for s in states], newest, moved)
        for s in states:
            if s.pending is not None:
                s.live, s.pending = s.pending, None

    def export(self, st: LiveSession) -> dict[str, np.ndarray]:
        return {**self.canvas.export(st.ground), **to_entries(st.live)}

    def install(self, st: LiveSession, state: Mapping[str, np.ndarray], scene: str) -> LiveSession | None:
        g = self.canvas.install(st.ground, state, scene)
        if g is None:
            return None
        live = from_entries(state, self.bank)  # a canvas without a live state starts one
        return LiveSession(g, live if live is not None else LiveState(seed=g.seed))

    def rebuild(self, st: LiveSession, frame: np.ndarray, prev: torch.Tensor) -> None:
        self.canvas.rebuild(st.ground, frame, prev)

    def ready_restore(self, state: ModelState) -> None:
        self.canvas.ready_restore(state)

    def release(self, st: LiveSession) -> None:
        self.canvas.release(st.ground)

    def busy(self) -> AbstractContextManager[None]:
        return self.canvas.busy()
