"""The anchor reference: a sharp frame moved by the camera's accumulated shift, in one resample.

The warp head moves the previous frame by a per-token kernel every frame. A fractional
(mouse) shift makes that an interpolation, and interpolations compound: after a few frames
of slow motion the carried ground is blurred, while the renderer samples its sharp texture
anew each frame. So the model also sees the anchor (an
observed frame, or a frame of its own it re-anchored on) moved by the camera shift summed
since then, resampled once, and a per-pixel mix in the head may copy from it
(``WorldModel._head``). Where the anchor never showed the place, or after a prompt change
made its colours stale, the reference is marked invalid and the warp alone decides.

The shift per action is the model's own estimate (``WorldModel.camera_shift``, a linear map
trained against the commanded shift); training builds references from the commanded shift.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.reference.start_views import Kept, StartViews, Views
from worldserve.session.family_state import entry, pack_scalar, scalar
from worldserve.session.plan import ModelState

REANCHOR_SHARE = 0.25  # re-anchor on the newest frame when less of the anchor than this stays in view
# ... and once the anchor is this many frames old: training shows the model anchors at most
# 15 frames back (16-frame sequences); an older one drifts apart from the view it has made
# since, and the per-pixel mix flickers between the two
REANCHOR_FRAMES = 64
SCENE_SETTLE_FRAMES = 8  # after a prompt change, frames to re-colour before the view re-anchors
MAX_WAIT = 1 << 20  # a restored anchor's wait or age past this is no state a runner made
FAMILY = "default"

CameraShift = Callable[[torch.Tensor, int], torch.Tensor]  # (actions (B, F, A), bucket) -> (B, F, 2) px


@dataclass(slots=True)
class AnchorState:
    """One session's anchor: the frame it moves, the camera shift summed since (dy, dx) px,
    frames to wait before re-anchoring when there is none, frames generated since it."""

    anchor: torch.Tensor | None = None  # (C, H, W) model floats
    offset: torch.Tensor | None = None  # (2,) float32 on the runner's device
    wait: int = 1
    age: int = 0

    def on(self, frame: torch.Tensor) -> None:
        """Make ``frame`` (C, H, W) the anchor, nothing moved yet."""
        self.anchor, self.wait, self.age = frame, 0, 0
        self.offset = torch.zeros(2, device=frame.device, dtype=torch.float32)


class AnchorReference:
    """The anchor as the runner's ``Reference`` (``base.py``): each session's own frame,
    moved by the camera shift the model estimates for its actions."""

    kind = "anchor"

    def __init__(self, cfg: ModelConfig, camera_shift: CameraShift, device: torch.device, dtype: torch.dtype) -> None:
        self.cfg, self.camera_shift, self.device, self.dtype = cfg, camera_shift, device, dtype

    def start_views(
        self, frame: Callable[[str, int, int], np.ndarray] | None, views: Views | None,
    ) -> StartViews | None:
        return None if frame is None else StartViews(frame)

    def open(self, seed: int, scene: str) -> AnchorState:
        return AnchorState()

    def adopt(self, kept: Kept | None) -> None:
        return None

    def write(self, st: AnchorState, frame: np.ndarray, ground: np.ndarray | None) -> None:
        return None  # the anchor is taken from the committed frame (``settle``)

    def settle(self, st: AnchorState, newest: torch.Tensor) -> None:
        st.on(newest)

    def rescene(self, st: AnchorState, scene: str) -> None:
        # the anchor's colours are the old scene's: it is dropped, and the view re-anchors
        # once it has re-coloured
        st.anchor, st.wait = None, SCENE_SETTLE_FRAMES

    def resized(self, st: AnchorState, newest: torch.Tensor | None) -> None:
        st.anchor = None
        if newest is not None:
            st.on(newest)

    def inputs(
        self, states: list[AnchorState], prev: torch.Tensor, actions: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, fc, c, h, _ = prev.shape
        zero = torch.zeros(2, device=self.device, dtype=torch.float32)
        start = torch.stack([zero if s.offset is None else s.offset for s in states])  # (B, 2)
        offsets = start[:, None] + self.camera_shift(actions, h).cumsum(1)  # (B, F, 2)
        anchors = torch.stack([p if s.anchor is None else s.anchor for s, p in zip(states, prev[:, 0], strict=True)])
        valid = torch.tensor([s.anchor is not None for s in states], device=self.device)
        ref = anchor_reference(
            anchors[:, None].expand(b, fc, c, h, h).reshape(b * fc, c, h, h), offsets.reshape(b * fc, 2),
            valid[:, None].expand(b, fc).reshape(-1),
        ).view(b, fc, c + 1, h, h)
        return ref, offsets

    def advance(self, states: list[AnchorState], newest: torch.Tensor, moved: torch.Tensor) -> None:
        move_anchors(states, newest, moved[:, -1], self.cfg.frames_per_chunk)

    def export(self, st: AnchorState) -> dict[str, np.ndarray]:
        out = {"anchor_wait": pack_scalar(st.wait), "anchor_age": pack_scalar(st.age)}
        if st.anchor is not None:
            out["anchor"] = st.anchor.float().cpu().numpy()
        if st.offset is not None:
            out["anchor_offset"] = st.offset.float().cpu().numpy()
        return out

    def install(self, st: AnchorState, state: Mapping[str, np.ndarray], scene: str) -> AnchorState | None:
        if "anchor_wait" not in state:
            return None
        prev = state.get("prev")
        frame = (self.cfg.channels, None, None) if prev is None else tuple(prev.shape)
        anchor = entry(state, "anchor", "float32", frame, optional=True, family=FAMILY)
        offset = entry(state, "anchor_offset", "float32", (2,), optional=True, family=FAMILY)
        st.wait = scalar(state, "anchor_wait", 0, MAX_WAIT, family=FAMILY)
        st.age = scalar(state, "anchor_age", 0, MAX_WAIT, family=FAMILY)
        st.anchor = None if anchor is None else self._tensor(anchor, self.dtype)
        st.offset = None if offset is None else self._tensor(offset, torch.float32)
        return st

    def rebuild(self, st: AnchorState, frame: np.ndarray, prev: torch.Tensor) -> None:
        st.on(prev)

    def ready_restore(self, state: ModelState) -> None:
        return None

    def release(self, st: AnchorState) -> None:
        return None

    def busy(self) -> AbstractContextManager[None]:
        return nullcontext()

    def _tensor(self, a: np.ndarray, kind: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(self.device, kind)


def clamped_actions(cfg: ModelConfig, actions: torch.Tensor) -> torch.Tensor:
    """Actions (..., A) inside the ranges training saw, as the camera shift is estimated for
    them: keys in [0, 1], mouse in [-1, 1]."""
    nk = cfg.num_keys
    return torch.cat((actions[..., :nk].clamp(0, 1), actions[..., nk:].clamp(-1, 1)), -1)


def anchor_reference(anchor: torch.Tensor, offset: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """The anchor moved by ``offset`` pixels, bilinear, and where it shows anything.

    anchor (B, C, H, W) frames in [-1, 1]; offset (B, 2) the static scene's shift (dy, dx)
    since the anchor, in pixels; ``valid`` (B,) bool, False for "no usable anchor". Returns
    (B, C + 1, H, W): out(y, x) = anchor(y - dy, x - dx), zero outside the anchor, then a
    mask channel, 1 where the source lies inside it."""
    b, _, h, w = anchor.shape
    dev, dt = anchor.device, anchor.dtype
    ys = torch.arange(h, device=dev, dtype=torch.float32)[None, :, None] - offset[:, 0, None, None].float()
    xs = torch.arange(w, device=dev, dtype=torch.float32)[None, None, :] - offset[:, 1, None, None].float()
    inside = ((ys >= 0) & (ys <= h - 1)) & ((xs >= 0) & (xs <= w - 1))  # (B, H, W)
    if valid is not None:
        inside = inside & valid[:, None, None]
    grid = torch.stack((xs.expand(b, h, w) * (2 / max(w - 1, 1)) - 1, ys.expand(b, h, w) * (2 / max(h - 1, 1)) - 1), -1)
    moved = F.grid_sample(anchor.float(), grid, mode="bilinear", padding_mode="zeros", align_corners=True)
    mask = inside[:, None].float()
    return torch.cat((moved * mask, mask), 1).to(dt)


def move_anchors(states: list[AnchorState], newest: torch.Tensor, offsets: torch.Tensor, frames_per_chunk: int) -> None:
    """After a generated chunk: keep each anchor's summed shift (``offsets`` (B, 2)); re-anchor
    on the ``newest`` frame where the anchor is ``REANCHOR_FRAMES`` old or has (nearly) left
    the view, or where there is none and the wait is over. On the device, without reading
    anything back."""
    low = visible_share(offsets, newest.shape[-1]) < REANCHOR_SHARE  # (B,)
    for i, s in enumerate(states):
        if s.anchor is None:
            s.wait -= 1
            if s.wait <= 0:
                s.on(newest[i])
            continue
        s.age += frames_per_chunk
        if s.age >= REANCHOR_FRAMES:
            s.on(newest[i])
            continue
        s.anchor = torch.where(low[i], newest[i], s.anchor)
        s.offset = torch.where(low[i], torch.zeros_like(offsets[i]), offsets[i])


def visible_share(offset: torch.Tensor, size: int) -> torch.Tensor:
    """Share of a ``size``² frame the anchor still covers after moving by ``offset`` (B, 2)."""
    cover = (1 - offset.abs() / max(size - 1, 1)).clamp(0, 1)
    return cover[:, 0] * cover[:, 1]


def sequence_references(frames: torch.Tensor, anchor: int, offsets: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Every frame's anchor reference in a training sequence: frames (B, N, C, H, W), the
    anchor's index, offsets (B, N, 2) and valid (B, N) (``train_targets.anchor_offsets``)
    -> (B, N, C + 1, H, W)."""
    b, n, c, h, w = frames.shape
    src = frames[:, anchor, None].expand(b, n, c, h, w).reshape(b * n, c, h, w)
    ref = anchor_reference(src, offsets.reshape(b * n, 2), valid.reshape(b * n))
    return ref.view(b, n, c + 1, h, w)
