"""What the network reads beside its cache: one protocol, two kinds.

Every frame the model gets a reference (B, F, C + 1, H, W): pixels of the place the frame
shows and a mask of where they hold. The anchor (``anchor.py``) takes it from a frame of the
session's own, moved by the camera; the world canvas (``canvas/``) from ground codes kept in
world coordinates. A runner holds one ``Reference`` and each session the state it opened
(``open``); the runner calls the same members whichever kind it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np
import torch

from worldserve.model.default.reference.start_views import Kept, StartViews, Views
from worldserve.session.plan import ModelState

StartFrame = Any  # Callable[[str, int, int], np.ndarray]: (scene, seed, bucket) -> the first view


class Reference(Protocol):
    kind: str  # "anchor" or "canvas": what ``Capabilities.reference`` says

    def start_views(self, frame: StartFrame | None, views: Views | None) -> StartViews | None:
        """What makes a fresh session's first view off the model thread (None without ``frame``)."""

    def open(self, seed: int, scene: str) -> Any:
        """A new session's state."""

    def adopt(self, kept: Kept | None) -> Any | None:
        """The state made with a start frame off the model thread, where there is one."""

    def write(self, st: Any, frame: np.ndarray, ground: np.ndarray | None) -> None:
        """An observed ``frame`` (or ``ground``, the ground alone under it) kept in memory."""

    def settle(self, st: Any, newest: torch.Tensor) -> None:
        """A real frame (C, H, W) was committed: the best reference there is."""

    def rescene(self, st: Any, scene: str) -> None:
        """The session's prompt changed."""

    def resized(self, st: Any, newest: torch.Tensor | None) -> None:
        """The session moved to another bucket; ``newest`` its last frame there, if any."""

    def inputs(self, states: list[Any], prev: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunk's references (B, F, C + 1, H, W) for actions (B, F, A), clamped to the
        ranges training saw, and what ``advance`` takes after the chunk (B, F, 2)."""

    def advance(self, states: list[Any], newest: torch.Tensor, moved: torch.Tensor) -> None:
        """After a generated chunk: ``newest`` (B, C, H, W) its last frames."""

    def export(self, st: Any) -> dict[str, np.ndarray]:
        """The state's entries in the family state (session/family_state.py)."""

    def install(self, st: Any, state: Mapping[str, np.ndarray], scene: str) -> Any | None:
        """The state a family state holds (``st`` where it holds none of this kind's): None
        where it holds nothing of this kind (the runner then ``rebuild``s)."""

    def rebuild(self, st: Any, frame: np.ndarray, prev: torch.Tensor) -> None:
        """Restored from frames alone: ``frame`` (H, W, 3) uint8 the newest, ``prev`` as the model holds it."""

    def ready_restore(self, state: ModelState) -> None:
        """Thread-safe: work for a snapshot about to be restored, done ahead (or nothing)."""

    def release(self, st: Any) -> None:
        """The session is gone."""

    def busy(self) -> AbstractContextManager[None]:
        """Around a chunk."""
