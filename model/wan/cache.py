"""The Wan causal family's KV cache: preallocated, fixed shapes, one slot per session.

(API published first; bodies follow.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from model.wan.config import WanConfig


class CacheFull(RuntimeError):
    """No free slot in the pool."""


@dataclass(slots=True)
class ChunkContext:
    """Everything a batch of chunks needs from the cache, built once per chunk on the host and
    reused by every denoising step and the commit pass."""

    cache: WanKVCache
    slots: list[int]  # (B,) slot of each batch row
    start_frames: np.ndarray  # (B,) epoch frame index of each chunk's first frame
    num_frames: int  # latent frames in each chunk (all rows alike)


@dataclass(slots=True)
class WanKVCache:
    cfg: WanConfig
    height: int  # latent height
    width: int  # latent width
    k: torch.Tensor  # (L, S, P*T, H, D)
    v: torch.Tensor  # (L, S, P*T, H, D)
    frame_at: np.ndarray  # (S, P) epoch frame index held at each position, -1 = empty
    next_frame: np.ndarray  # (S,) next epoch frame each slot expects
    free_slots: list[int]

    @classmethod
    def create(
        cls, cfg: WanConfig, height: int, width: int, slots: int,
        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
    ) -> WanKVCache:
        """A pool of ``slots`` session caches for latents of ``height`` x ``width``."""
        raise NotImplementedError

    def allocate(self) -> int:
        """Take a free slot (empty, expecting frame 0); ``CacheFull`` when none is left."""
        raise NotImplementedError

    def release(self, slot: int) -> None:
        raise NotImplementedError

    def reset(self, slot: int) -> None:
        """Empty a slot (a new epoch): it expects frame 0 next."""
        raise NotImplementedError

    def chunk(self, slots: list[int], start_frames: np.ndarray | list[int] | None = None,
              num_frames: int | None = None) -> ChunkContext:
        """The context of a batch of chunks: row b generates frames ``start_frames[b]`` ..
        ``+ num_frames - 1`` of slot ``slots[b]`` (default: each slot's next frame, and
        ``cfg.chunk_frames``)."""
        raise NotImplementedError
