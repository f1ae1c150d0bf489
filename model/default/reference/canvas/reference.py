"""The world canvas as the runner's ``Reference`` (``reference/base.py``): each session's
ground codes in world coordinates, drawn as its reference every frame (``ground.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager

import numpy as np
import torch

from worldserve.model.default.reference.anchor import CameraShift
from worldserve.model.default.reference.canvas.ground import GroundPainter, SessionGround
from worldserve.model.default.reference.canvas.restores import ReadyRestores
from worldserve.model.default.reference.canvas.state import from_entries, to_entries
from worldserve.model.default.reference.start_views import Kept, StartViews, Views
from worldserve.session.plan import ModelState
from worldserve.world.scene import parse_prompt


class CanvasReference:
    kind = "canvas"

    def __init__(self, painter: GroundPainter, camera_shift: CameraShift, device: torch.device) -> None:
        self.painter, self.camera_shift, self.device = painter, camera_shift, device
        self.restores = ReadyRestores(painter.release)

    def start_views(
        self, frame: Callable[[str, int, int], np.ndarray] | None, views: Views | None,
    ) -> StartViews | None:
        """A served session's canvas is made with its start frame, off the model thread."""
        if frame is None:
            return None
        return StartViews(frame, views, ready=self.painter.ready_scene, release=self.painter.release)

    def open(self, seed: int, scene: str) -> SessionGround:
        return self.painter.start(seed, parse_prompt(scene))

    def adopt(self, kept: Kept | None) -> SessionGround | None:
        return kept.ready if kept is not None and isinstance(kept.ready, SessionGround) else None

    def write(self, st: SessionGround, frame: np.ndarray, ground: np.ndarray | None) -> None:
        self.painter.observe(st, frame if ground is None else ground, seen=ground is None)

    def settle(self, st: SessionGround, newest: torch.Tensor) -> None:
        return None  # the canvas keeps what ``write`` wrote

    def rescene(self, st: SessionGround, scene: str) -> None:
        self.painter.rescene(st, parse_prompt(scene))  # the same codes, re-skinned by the decoder

    def resized(self, st: SessionGround, newest: torch.Tensor | None) -> None:
        return None  # the canvas is in world units: every bucket reads the same one

    def inputs(
        self, states: list[SessionGround], prev: torch.Tensor, actions: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        bucket = prev.shape[-1]
        shifts = self.camera_shift(actions, bucket).float().cpu().numpy()  # (B, F, 2) px
        return self.painter.references(states, shifts, bucket).to(self.device), actions[..., :2]

    def advance(self, states: list[SessionGround], newest: torch.Tensor, moved: torch.Tensor) -> None:
        for g in states:  # the camera moves to the chunk's last place
            self.painter.moved(g)

    def export(self, st: SessionGround) -> dict[str, np.ndarray]:
        return to_entries(st.to_state())

    def install(self, st: SessionGround, state: Mapping[str, np.ndarray], scene: str) -> SessionGround | None:
        canvas = from_entries(state)
        if canvas is None:
            return None
        look = parse_prompt(scene)
        self.painter.release(st)
        key = state.get("canvas_codes")
        return self.restores.take(key, lambda g: g.look == look) or self.painter.restore(canvas, look)

    def rebuild(self, st: SessionGround, frame: np.ndarray, prev: torch.Tensor) -> None:
        self.painter.observe(st, frame)  # a state without a canvas: its newest frame starts one

    def ready_restore(self, state: ModelState) -> None:
        """The snapshot's canvas rebuilt and its first tiles decoded now, on the calling
        thread; the restore adopts it (``restores.py``), found by the snapshot's codes array."""
        try:
            canvas = from_entries(state.family_state)
            if canvas is not None:
                key = state.family_state["canvas_codes"]
                self.restores.put(key, self.painter.ready_restore(canvas, parse_prompt(state.scene)))
        except ValueError:
            return  # refused with a clear error when the session is restored

    def release(self, st: SessionGround) -> None:
        self.painter.release(st)  # its queued tiles would hold up live sessions'

    def busy(self) -> AbstractContextManager[None]:
        return self.painter.busy()
