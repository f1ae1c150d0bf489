"""One session's physical state in the default runner, and its exact hand-off.

``SessionSlot`` is what the runner holds for a session beside its KV cache slot. A
``Continuation`` (session/plan.py) carries what shapes the session's next frames: the cached
keys/values in frame order, the exact previous frame and the anchor reference's state.
``export_continuation`` takes it from a slot, ``install_continuation`` puts it back, so a
restored session makes exactly the frames it would have made where it was.
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from worldserve.model.default.kv_cache import KVCachePool
from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.reference.anchor import REANCHOR_FRAMES, REANCHOR_SHARE, visible_share
from worldserve.model.default.reference.canvas.ground import SessionGround
from worldserve.session.plan import Continuation, ModelState


@dataclass(slots=True)
class SessionSlot:
    """Physical state of one session."""

    bucket: int
    slot: int
    frame_index: int  # epoch index of the next frame to generate
    prev: torch.Tensor  # (C, H, W) last committed clean frame; zeros before the first
    scene_text: str
    scene: torch.Tensor  # (scene_dim,)
    gen: torch.Generator  # the session's noise, on the runner's device
    sinks: list[np.ndarray] = field(default_factory=list)  # clean sink frames (H, W, 3) uint8
    window: deque[np.ndarray] = field(default_factory=deque)  # last K clean frames, oldest first
    # the anchor reference (model/default/reference/anchor.py): the frame it moves, the
    # camera shift summed since (dy, dx) px, and frames to wait before re-anchoring when none
    anchor: torch.Tensor | None = None  # (C, H, W) model floats
    offset: torch.Tensor | None = None  # (2,) float32 on the runner's device
    anchor_wait: int = 1
    anchor_age: int = 0  # frames generated since the anchor
    ground: SessionGround | None = None  # the world canvas, where the runner keeps one (model/default/reference/canvas/ground.py)


def anchor_on(s: SessionSlot, frame: torch.Tensor) -> None:
    """Make ``frame`` (C, H, W) the session's anchor, nothing moved yet."""
    s.anchor, s.offset, s.anchor_wait, s.anchor_age = frame, torch.zeros(2, device=frame.device, dtype=torch.float32), 0, 0


def move_anchors(states: list[SessionSlot], newest: torch.Tensor, offsets: torch.Tensor, frames_per_chunk: int) -> None:
    """After a generated chunk: keep each anchor's summed shift (``offsets`` (B, 2)); re-anchor
    on the ``newest`` frame where the anchor is ``REANCHOR_FRAMES`` old or has (nearly) left
    the view, or where there is none and the wait is over. On the device, without reading
    anything back."""
    low = visible_share(offsets, newest.shape[-1]) < REANCHOR_SHARE  # (B,)
    for i, s in enumerate(states):
        if s.anchor is None:
            s.anchor_wait -= 1
            if s.anchor_wait <= 0:
                anchor_on(s, newest[i])
            continue
        s.anchor_age += frames_per_chunk
        if s.anchor_age >= REANCHOR_FRAMES:
            anchor_on(s, newest[i])
            continue
        s.anchor = torch.where(low[i], newest[i], s.anchor)
        s.offset = torch.where(low[i], torch.zeros_like(offsets[i]), offsets[i])


def cached_ids(s: SessionSlot) -> list[int]:
    """The epoch indices of the frames the session's cache holds: sinks, then window."""
    return [*range(len(s.sinks)), *range(s.frame_index - len(s.window), s.frame_index)]


def export_continuation(cfg: ModelConfig, pool: KVCachePool, s: SessionSlot) -> Continuation:
    """The slot's cached keys/values in frame order, the exact previous frame and the
    anchor reference's state, as float32 copies, and its world canvas where it has one."""
    ids = cached_ids(s)
    pos = [pool.position(i) for i in ids]
    held = pool.frame_at[s.slot, pos].tolist()
    if held != ids:
        raise RuntimeError(f"session cache holds frames {held} where its window says {ids}")
    t = cfg.tokens_per_frame(s.bucket)
    per_frame = (cfg.depth, cfg.cache_frames, t, cfg.heads, cfg.head_dim)
    k = pool.k[:, s.slot].reshape(per_frame)[:, pos]  # (L, N, T, H, D)
    v = pool.v[:, s.slot].reshape(per_frame)[:, pos]
    return Continuation(
        kv=torch.stack((k, v)).float().cpu().numpy(),  # (2, L, N, T, H, D)
        prev=s.prev.float().cpu().numpy(),
        anchor=None if s.anchor is None else s.anchor.float().cpu().numpy(),
        anchor_offset=None if s.offset is None else s.offset.float().cpu().numpy(),
        anchor_wait=s.anchor_wait,
        anchor_age=s.anchor_age,
        canvas=None if s.ground is None else s.ground.to_state(),
    )


def install_continuation(
    cfg: ModelConfig, pool: KVCachePool, s: SessionSlot, c: Continuation, device: torch.device, dtype: torch.dtype,
) -> None:
    """Install an exported ``Continuation``: the cache and the state beside it exactly as
    they were, no re-cache (the world canvas is the runner's to install)."""
    b = s.bucket
    ids = cached_ids(s)
    t = cfg.tokens_per_frame(b)
    want = (2, cfg.depth, len(ids), t, cfg.heads, cfg.head_dim)
    frame = (cfg.channels, b, b)
    if c.kv.shape != want:
        raise ValueError(f"snapshot keys/values {c.kv.shape} do not fit this model's cache {want}")
    if c.prev.shape != frame:
        raise ValueError(f"snapshot previous frame {c.prev.shape}, expected {frame}")
    if c.anchor is not None and c.anchor.shape != frame:
        raise ValueError(f"snapshot anchor {c.anchor.shape} does not fit this model's frames {frame}")
    if c.anchor_offset is not None and c.anchor_offset.shape != (2,):
        raise ValueError(f"snapshot anchor offset {c.anchor_offset.shape}, expected (2,)")
    if c.anchor_wait < 0 or c.anchor_age < 0:
        raise ValueError(f"snapshot anchor wait {c.anchor_wait} and age {c.anchor_age} must be >= 0")
    arrays = [c.kv, c.prev, *(a for a in (c.anchor, c.anchor_offset) if a is not None)]
    if not all(np.isfinite(a).all() for a in arrays):
        raise ValueError("snapshot continuation holds values that are not finite")

    def tensor(a: np.ndarray, kind: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(device, kind)

    pool.frame_at[s.slot] = -1
    if ids:
        kv = tensor(c.kv, dtype).flatten(2, 3)[:, :, None]  # (2, L, 1, N*T, H, D)
        pool.commit([s.slot], np.asarray([ids]), kv[0], kv[1])
    s.prev = tensor(c.prev, dtype)
    s.anchor = None if c.anchor is None else tensor(c.anchor, dtype)
    s.offset = None if c.anchor_offset is None else tensor(c.anchor_offset, torch.float32)
    s.anchor_wait, s.anchor_age = c.anchor_wait, c.anchor_age


def reseed(st: ModelState) -> int:
    """A seed for a restored session's noise, from what its snapshot holds."""
    digest = hashlib.blake2b(np.ascontiguousarray(st.rng).tobytes(), digest_size=8,
                             person=st.frame_index.to_bytes(8, "little"))
    return int.from_bytes(digest.digest(), "little") >> 1
