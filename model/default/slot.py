"""One session's physical state in the default runner, and its exact hand-off.

``SessionSlot`` is what the runner holds for a session beside its KV cache slot. Its family
state (``ModelState.family_state``, session/family_state.py) carries what shapes the
session's next frames: ``kv`` float32 (2, L, N, T, H, D), the cached keys (rotated in space)
and values in frame order (sinks first, then the window oldest first), ``prev`` float32
(C, H, W) the exact previous frame, and the reference's entries (``Reference.export``).
``export_cache`` takes the first two from a slot, ``install_cache`` puts them back, so a
restored session makes exactly the frames it would have made where it was; all float32,
exact copies of the model's floats (a bf16 runner's values widen and narrow back unchanged).
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from worldserve.model.default.kv_cache import KVCachePool
from worldserve.model.default.net.config import ModelConfig
from worldserve.session.family_state import entry
from worldserve.session.plan import ModelState

FAMILY = "default"


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
    ref: Any  # what the runner's ``Reference`` opened for it (reference/base.py)
    sinks: list[np.ndarray] = field(default_factory=list)  # clean sink frames (H, W, 3) uint8
    window: deque[np.ndarray] = field(default_factory=deque)  # last K clean frames, oldest first


def cached_ids(s: SessionSlot) -> list[int]:
    """The epoch indices of the frames the session's cache holds: sinks, then window."""
    return [*range(len(s.sinks)), *range(s.frame_index - len(s.window), s.frame_index)]


def export_cache(cfg: ModelConfig, pool: KVCachePool, s: SessionSlot) -> dict[str, np.ndarray]:
    """The slot's cached keys/values in frame order and the exact previous frame, as float32."""
    ids = cached_ids(s)
    pos = [pool.position(i) for i in ids]
    held = pool.frame_at[s.slot, pos].tolist()
    if held != ids:
        raise RuntimeError(f"session cache holds frames {held} where its window says {ids}")
    t = cfg.tokens_per_frame(s.bucket)
    per_frame = (cfg.depth, cfg.cache_frames, t, cfg.heads, cfg.head_dim)
    k = pool.k[:, s.slot].reshape(per_frame)[:, pos]  # (L, N, T, H, D)
    v = pool.v[:, s.slot].reshape(per_frame)[:, pos]
    return {"kv": torch.stack((k, v)).float().cpu().numpy(), "prev": s.prev.float().cpu().numpy()}


def install_cache(
    cfg: ModelConfig, pool: KVCachePool, s: SessionSlot, state: Mapping[str, np.ndarray],
    device: torch.device, dtype: torch.dtype,
) -> bool:
    """Install exported keys/values and previous frame exactly as they were, no re-cache;
    False where ``state`` holds none (the runner then re-caches from the frames)."""
    if "kv" not in state:
        return False
    b = s.bucket
    ids = cached_ids(s)
    want = (2, cfg.depth, len(ids), cfg.tokens_per_frame(b), cfg.heads, cfg.head_dim)
    kv = entry(state, "kv", "float32", want, family=FAMILY)
    prev = entry(state, "prev", "float32", (cfg.channels, b, b), family=FAMILY)
    assert kv is not None and prev is not None

    def tensor(a: np.ndarray, kind: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(device, kind)

    pool.frame_at[s.slot] = -1
    if ids:
        kvt = tensor(kv, dtype).flatten(2, 3)[:, :, None]  # (2, L, 1, N*T, H, D)
        pool.commit([s.slot], np.asarray([ids]), kvt[0], kvt[1])
    s.prev = tensor(prev, dtype)
    return True


def reseed(st: ModelState) -> int:
    """A seed for a restored session's noise, from what its snapshot holds."""
    digest = hashlib.blake2b(np.ascontiguousarray(st.rng).tobytes(), digest_size=8,
                             person=st.frame_index.to_bytes(8, "little"))
    return int.from_bytes(digest.digest(), "little") >> 1
