"""A preallocated, fixed-shape rolling KV cache: one pool per resolution bucket, one slot per session.

Buffer layout of one slot, by frame position (each position holds T = tokens_per_frame tokens)::

    position  | 0 ........ s-1 | s ............................ s+K-1 |
    holds     | sink frames    | ring: frame g at s + (g - s) % K      |
              | 0 .. s-1       | (the last K committed frames)         |

    k, v: (L, S, (s+K)*T, H, D)      L layers, S slots, H heads, D head dim

Keys are stored rotated in space only; ``context`` rotates them by their frame time relative
to the chunk being generated (``model/default/net/rope.py``). The cursors (``frame_at``: which epoch frame
each position holds, -1 when empty) are host-side numpy, so building a chunk's context never
reads a tensor back. Memory is fixed at creation: a session can run forever in it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.net.dit import ChunkContext
from worldserve.model.default.net.rope import Rope, RopeTables
from worldserve.model.plan_walk import CacheFull


@dataclass(slots=True)
class KVCachePool:
    cfg: ModelConfig
    bucket: int
    rope: RopeTables
    k: torch.Tensor  # (L, S, P*T, H, D)
    v: torch.Tensor  # (L, S, P*T, H, D)
    frame_at: np.ndarray  # (S, P) int64, epoch frame index at each position, -1 = empty
    free_slots: list[int]

    @classmethod
    def create(
        cls, cfg: ModelConfig, bucket: int, slots: int, rope: RopeTables,
        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
    ) -> KVCachePool:
        shape = (cfg.depth, slots, cfg.kv_cache_tokens(bucket), cfg.heads, cfg.head_dim)
        return cls(
            cfg=cfg,
            bucket=bucket,
            rope=rope,
            k=torch.zeros(shape, dtype=dtype, device=device),
            v=torch.zeros(shape, dtype=dtype, device=device),
            frame_at=np.full((slots, cfg.cache_frames), -1, dtype=np.int64),
            free_slots=list(range(slots - 1, -1, -1)),
        )

    @property
    def capacity(self) -> int:
        return self.frame_at.shape[0]

    def allocate(self) -> int:
        if not self.free_slots:
            raise CacheFull(f"bucket {self.bucket}: all {self.capacity} KV cache slots are in use")
        slot = self.free_slots.pop()
        self.frame_at[slot] = -1
        return slot

    def release(self, slot: int) -> None:
        if not 0 <= slot < self.capacity or slot in self.free_slots:
            raise ValueError(f"bucket {self.bucket}: slot {slot} is not allocated")
        self.frame_at[slot] = -1
        self.free_slots.append(slot)

    def position(self, frame: int) -> int:
        """Cache position of epoch frame ``frame``."""
        s, k = self.cfg.sink_frames, self.cfg.window_frames
        return frame if frame < s else s + (frame - s) % k

    def context(
        self, slots: list[int], chunk_starts: np.ndarray,
        out: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> ChunkContext:
        """Gather the slots of a batch and rotate their keys for chunks starting at
        ``chunk_starts`` (B,) epoch frame indices, into buffers with room at the end for the
        chunk's own keys/values. Built once per chunk, reused by every denoising step and
        the commit pass. ``out``: buffers (L, >= B, Nc + Tq, H, D) to fill (their first B
        rows) instead of new ones, as a captured chunk (``model/default/chunk_graph.py``) needs."""
        cfg, t = self.cfg, self.cfg.tokens_per_frame(self.bucket)
        b, fc = len(slots), cfg.frames_per_chunk
        idx = torch.as_tensor(slots, device=self.k.device)
        nc = self.k.shape[2]
        shape = (self.k.shape[0], b, nc + fc * t, *self.k.shape[3:])  # the chunk's own keys last
        if out is None:
            k_all, v_all = self.k.new_empty(shape), self.v.new_empty(shape)
        else:
            k_all, v_all = out[0][:, :b], out[1][:, :b]
            if k_all.shape != shape or v_all.shape != shape:
                raise ValueError(f"context buffers {tuple(out[0].shape)} do not hold {shape}")
        v_all[:, :, :nc] = torch.index_select(self.v, 1, idx)
        frames = self.frame_at[slots]  # (B, P)
        valid = frames >= 0
        rel = torch.from_numpy(frames - chunk_starts[:, None]).reshape(-1)
        sink = torch.from_numpy(valid & (frames < cfg.sink_frames)).reshape(-1)
        rot = self.rope.time(rel, sink, t)  # (B*P*T, D)
        rot = Rope(rot.cos.view(b, -1, rot.cos.shape[-1]), rot.sin.view(b, -1, rot.sin.shape[-1]))
        k_all[:, :, :nc] = rot.to(self.k.dtype, self.k.device).apply(torch.index_select(self.k, 1, idx))

        own = np.arange(fc)
        rope_q = self.rope.time(torch.from_numpy(own), torch.zeros(fc, dtype=torch.bool), t)
        own_frames = chunk_starts[:, None] + own[None, :]  # (B, F)
        rope_k = self.rope.time(
            torch.from_numpy(np.tile(own, b)),
            torch.from_numpy((own_frames < cfg.sink_frames).reshape(-1)),
            t,
        )
        rope_k = Rope(rope_k.cos.view(b, fc * t, -1), rope_k.sin.view(b, fc * t, -1))

        mask = None
        if not valid.all():
            tok_valid = np.repeat(valid, t, axis=1)  # (B, P*T)
            full = np.concatenate((tok_valid, np.ones((b, fc * t), dtype=bool)), 1)
            mask = torch.from_numpy(full).to(self.k.device)[:, None, None, :]
        # One-frame chunks rotate their queries by time 0, and their own keys too unless
        # the chunk is a sink frame: known on the host, so those rotations are skipped.
        rope_q.identity = fc == 1
        rope_k.identity = fc == 1 and bool((own_frames >= cfg.sink_frames).all())
        return ChunkContext(
            k=k_all, v=v_all, mask=mask, rope_q=rope_q.to(k_all.dtype, k_all.device),
            rope_k=rope_k.to(k_all.dtype, k_all.device),
        )

    def commit(self, slots: list[int], frame_ids: np.ndarray, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write keys/values (L, B, n*T, H, D) of frames ``frame_ids`` (B, n) into the slots.

        The one mutating method. Frames must be new to the slot (the next ones of its epoch)
        or a rebuild of what it held; the ring overwrites the oldest window frame.
        """
        t = self.cfg.tokens_per_frame(self.bucket)
        b, n = frame_ids.shape
        if k.shape[1] != b or k.shape[2] != n * t:
            raise ValueError(
                f"bucket {self.bucket}: keys {tuple(k.shape)} do not match {b} slots x {n} frames x {t} tokens"
            )
        pos = np.vectorize(self.position, otypes=[np.int64])(frame_ids)  # (B, n)
        tok = (pos[:, :, None] * t + np.arange(t)[None, None, :]).reshape(b, n * t)
        rows = torch.as_tensor(slots, device=self.k.device)[:, None]
        cols = torch.from_numpy(tok).to(self.k.device)
        self.k[:, rows, cols] = k.to(self.k.dtype)
        self.v[:, rows, cols] = v.to(self.v.dtype)
        self.frame_at[np.asarray(slots)[:, None], pos] = frame_ids
