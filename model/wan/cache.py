"""The Wan causal family's KV cache: preallocated, fixed shapes, one slot per session.

Buffer layout of one slot, by frame position (each position holds T = tokens_per_frame tokens)::

    position  | 0 ........ s-1 | s ............................ s+R-1 |
    holds     | sink frames    | ring: frame g at s + (g - s) % R      |
              | 0 .. s-1       | (the last R committed frames)         |

    k, v:     (L, S, (s+R)*T, H, D)    L layers, S slots, H heads, D head dim
    latents:  (S, s+R, C, h, w)        the clean latent frame behind each position (C = out_dim)

A chunk sees the sinks, the window (the latest K committed frames) and itself. The ring holds
R = max(K, chunk) frames: the window, or where the window is shorter than a chunk (Matrix-Game's
gta_drive: K = 1, chunks of 3) the whole last chunk, of which the older frames are masked.
Keys are stored after ``norm_k``, rotated in space (height, width): those angles belong to the
token and never change. Their time rotation depends on the position scheme (``cfg.positions``), each
one an authors' attention module:

- ``absolute`` (LongLive's and Self-Forcing's ``causal_model.py``): a frame's position is its
  epoch index, so its keys are rotated in time when written, and read as stored. The sinks stay
  at 0 .. s-1 while the chunk sits at n, n+1, ... Positions grow without bound: the authors'
  table of 1,024 positions ends at latent frame 1,023 (4,093 pixel frames, 4 min 16 s at 16 fps),
  where their code stops and this one goes on.
- ``rank`` (LongLive's ``causal_model_infinity.py``; the house's default): the held frames,
  oldest first, sit at their rank in the list sinks then window, and the chunk's frames follow at
  M, M+1, ... (M = frames held); keys are rotated in time when a chunk reads them. Positions stay
  below s + K + chunk for ever.

The two agree until the window first rolls (the held frames are 0 .. n-1 then), and without
sinks for ever (ranks are absolute positions less a constant, and RoPE sees differences only).
With sinks, once the window has rolled, they differ: every frame from latent frame s + K + chunk
on (12 for LongLive).

The cursors (``frame_at``: which epoch frame each position holds, -1 when empty;
``next_frame``) are host-side numpy, so building a chunk's context never reads a tensor back.
Memory is fixed at creation: a session can run for ever in it. At Wan2.1-1.3B's size (30
layers, width 1536, 1,560 tokens a frame at 480x832) with 3 sinks and a window of 9, a slot's
keys and values take 2 x 30 x 12 x 1560 x 1536 x 2 bytes = 3.45 GB in bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from worldserve.model.plan_walk import CacheFull
from worldserve.model.wan.config import WanConfig


@dataclass(slots=True)
class WanChunkContext:
    """What a batch of chunks needs from the cache, built once per chunk on the host and reused
    by every denoising step and the commit pass. Row b generates frames ``start_frames[b]`` ..
    ``start_frames[b] + num_frames - 1`` of slot ``slots[b]``."""

    cache: WanKVCache
    slots: list[int]  # (B,) slot of each batch row
    start_frames: np.ndarray  # (B,) epoch frame index of each chunk's first frame
    num_frames: int  # latent frames in each chunk (all rows alike)
    slot_index: torch.Tensor  # (B,) long, slots on the cache's device
    used: int  # cached tokens read: positions 0 .. used/T - 1 hold every row's frames
    cache_positions: np.ndarray  # (B, used/T) RoPE time position of each cached frame position (0 where empty)
    cache_valid: np.ndarray  # (B, used/T) bool, the position holds a frame the chunk reads
    rope_positions: np.ndarray  # (B, F) RoPE time positions of the chunk's frames
    keys_rotated: bool  # the cache stores keys rotated in time (absolute positions): read them as they are
    cache_cos: torch.Tensor | None  # (B, used, 1, Pt) time rotation of the cached keys (None: as stored)
    cache_sin: torch.Tensor | None  # (B, used, 1, Pt)
    chunk_cos: torch.Tensor  # (B, F*T, 1, Pt) time rotation of the chunk's queries and keys
    chunk_sin: torch.Tensor  # (B, F*T, 1, Pt)
    space_cos: torch.Tensor  # (1, F*T, 1, Ph+Pw) height/width rotation of the chunk's tokens
    space_sin: torch.Tensor  # (1, F*T, 1, Ph+Pw)
    mask: torch.Tensor | None  # (B, 1, 1, used + F*T) bool, True = attend; None = all valid
    write_tokens: torch.Tensor  # (B, F*T) long, where the commit writes each token
    write_positions: np.ndarray  # (B, F) frame positions the commit fills

    @property
    def batch(self) -> int:
        return len(self.slots)


@dataclass(slots=True)
class WanKVCache:
    cfg: WanConfig
    height: int  # latent height
    width: int  # latent width
    k: torch.Tensor  # (L, S, P*T, H, D) keys after norm_k, rotated in space only
    v: torch.Tensor  # (L, S, P*T, H, D)
    latents: torch.Tensor  # (S, P, C, h, w) clean latents of the held frames
    frame_at: np.ndarray  # (S, P) int64 epoch frame index at each position, -1 = empty
    next_frame: np.ndarray  # (S,) int64 next epoch frame each slot expects
    free_slots: list[int]

    @classmethod
    def create(
        cls, cfg: WanConfig, height: int, width: int, slots: int,
        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
    ) -> WanKVCache:
        """A pool of ``slots`` session caches for latents of ``height`` x ``width``."""
        if slots < 1:
            raise ValueError(f"a KV cache pool needs at least 1 slot, got {slots}")
        t = cfg.tokens_per_frame(height, width)
        p = cfg.cache_frames
        shape = (cfg.num_layers, slots, p * t, cfg.num_heads, cfg.head_dim)
        return cls(
            cfg=cfg, height=height, width=width,
            k=torch.zeros(shape, dtype=dtype, device=device),
            v=torch.zeros(shape, dtype=dtype, device=device),
            latents=torch.zeros((slots, p, cfg.out_dim, height, width), dtype=torch.float32, device=device),
            frame_at=np.full((slots, p), -1, dtype=np.int64),
            next_frame=np.zeros(slots, dtype=np.int64),
            free_slots=list(range(slots - 1, -1, -1)),
        )

    @property
    def capacity(self) -> int:
        return self.frame_at.shape[0]

    @property
    def tokens_per_frame(self) -> int:
        return self.cfg.tokens_per_frame(self.height, self.width)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.latents))

    # --- slots ---
    def allocate(self) -> int:
        """Take a free slot (empty, expecting frame 0); ``CacheFull`` when none is left."""
        if not self.free_slots:
            raise CacheFull(f"Wan KV cache {self.height}x{self.width}: all {self.capacity} slots are in use")
        slot = self.free_slots.pop()
        self.reset(slot)
        return slot

    def release(self, slot: int) -> None:
        self._check_slot(slot)
        self.reset(slot)
        self.free_slots.append(slot)

    def reset(self, slot: int) -> None:
        """Empty a slot (a new epoch): it expects frame 0 next. Tensors are left as they are:
        nothing reads a position whose ``frame_at`` is -1."""
        self.frame_at[slot] = -1
        self.next_frame[slot] = 0

    def seek(self, slot: int, frame: int) -> None:
        """Make an empty or partly rebuilt slot expect ``frame`` next, skipping the frames the
        window has already dropped (used by ``CausalWanModel.recache`` only)."""
        self._check_slot(slot)
        if frame < self.next_frame[slot]:
            raise ValueError(
                f"slot {slot}: cannot seek back to frame {frame}, it expects frame {self.next_frame[slot]}"
            )
        self.next_frame[slot] = frame

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.capacity or slot in self.free_slots:
            raise ValueError(f"Wan KV cache: slot {slot} is not allocated (capacity {self.capacity})")

    def position(self, frame: int) -> int:
        """Cache position of epoch frame ``frame``."""
        s, r = self.cfg.sink_frames, self.cfg.ring_frames
        return frame if frame < s else s + (frame - s) % r

    def held(self, slot: int) -> tuple[np.ndarray, torch.Tensor]:
        """The frames a slot holds, oldest first: (frame ids (N,), clean latents (C, N, h, w)).
        What a snapshot carries, and what ``recache`` takes."""
        self._check_slot(slot)
        frames = self.frame_at[slot]
        pos = np.flatnonzero(frames >= 0)
        pos = pos[np.argsort(frames[pos])]
        lat = self.latents[slot, torch.from_numpy(pos).to(self.latents.device)]  # (N, C, h, w)
        return frames[pos].copy(), lat.transpose(0, 1).contiguous()

    def take(self, slot: int, other: WanKVCache, other_slot: int, frames: list[int]) -> None:
        """Copy the keys, values and latents of epoch ``frames`` (held by ``other``'s slot, a
        cache of the same frame size) into this empty slot, which then expects the frame after
        the last (LongLive's prompt switch builds the window in a scratch cache)."""
        self._check_slot(slot)
        t = self.tokens_per_frame
        for g in frames:
            src, dst = other.position(g), self.position(g)
            if other.frame_at[other_slot, src] != g:
                raise ValueError(f"slot {other_slot} does not hold frame {g} (position {src} holds "
                                 f"{other.frame_at[other_slot, src]})")
            self.k[:, slot, dst * t:(dst + 1) * t] = other.k[:, other_slot, src * t:(src + 1) * t]
            self.v[:, slot, dst * t:(dst + 1) * t] = other.v[:, other_slot, src * t:(src + 1) * t]
            self.latents[slot, dst] = other.latents[other_slot, src]
            self.frame_at[slot, dst] = g
        self.next_frame[slot] = max(frames) + 1

    # --- one chunk ---
    def chunk(
        self, slots: list[int], start_frames: np.ndarray | list[int] | None = None,
        num_frames: int | None = None, anchor: bool = False,
    ) -> WanChunkContext:
        """The context of a batch of chunks: row b generates frames ``start_frames[b]`` ..
        ``+ num_frames - 1`` of slot ``slots[b]`` (default: each slot's next frame, and
        ``cfg.chunk_frames``). A start must be the frame the slot expects next.

        Rolling Forcing (``cfg.sampler`` "rolling") reads two sets. Its window pass
        (``anchor``) reads the sinks, its anchor block, moved to sit just before the latest
        committed chunk, and that chunk; its commit reads the latest ``window_frames`` frames,
        the sinks among them only while they are."""
        cfg, t = self.cfg, self.tokens_per_frame
        f = cfg.chunk_frames if num_frames is None else num_frames
        if not 1 <= f <= cfg.ring_frames:
            raise ValueError(f"a chunk of {f} frames does not fit a ring of {cfg.ring_frames}")
        if len(set(slots)) != len(slots) or not slots:
            raise ValueError(f"a batch needs distinct slots, got {slots}")
        for s in slots:
            self._check_slot(s)
        expect = self.next_frame[slots]
        starts = expect.copy() if start_frames is None else np.asarray(start_frames, dtype=np.int64)
        if starts.shape != (len(slots),):
            raise ValueError(f"start_frames {starts.tolist()} do not match slots {slots}")
        for b, (s, got, want) in enumerate(zip(slots, starts.tolist(), expect.tolist(), strict=True)):
            if got != want:
                raise ValueError(f"batch row {b}: slot {s} expects frame {want} next, not frame {got}")

        frames = self.frame_at[slots]  # (B, P)
        rolling, sink = cfg.sampler == "rolling", frames < cfg.sink_frames
        if anchor and not (rolling and cfg.positions == "absolute"):
            raise ValueError("an anchor read is Rolling Forcing's, with absolute positions")
        # the frames the chunk reads: the sinks and the window (the ring may hold older ones)
        recent = frames >= starts[:, None] - (cfg.chunk_frames if anchor else cfg.window_frames)
        valid = (frames >= 0) & (recent | (sink & (anchor or not rolling)))
        held = valid.sum(1)  # (B,) M per row
        used_frames = int(max((np.flatnonzero(v).max() + 1 if v.any() else 0) for v in valid))
        dev = self.k.device
        absolute = cfg.positions == "absolute"
        if absolute:  # each frame at its epoch index; an anchor's sinks just before the frames after them
            pos = np.where(valid, frames, 0)
            if anchor:
                after = np.where(valid & ~sink, frames, np.iinfo(np.int64).max).min(1)
                first = np.where((valid & ~sink).any(1), after, starts)  # (B,)
                pos = np.where(valid & sink, first[:, None] - cfg.sink_frames + frames, pos)
            own = starts[:, None] + np.arange(f)[None, :]  # (B, F)
        else:  # rank of each held frame among its row's held frames (oldest = 0), the chunk after them
            big = np.where(valid, frames, np.iinfo(np.int64).max)
            pos = np.where(valid, np.argsort(np.argsort(big, axis=1), axis=1), 0)
            own = held[:, None] + np.arange(f)[None, :]  # (B, F)
        cache_cos = cache_sin = None
        if not absolute:  # stored keys are rotated in space only: their time rotation is this chunk's
            cache_cos, cache_sin = time_rotation(cfg, np.repeat(pos[:, :used_frames], t, axis=1), dev)  # (B, used)
        elif (moved := np.where(valid, pos - frames, 0)[:, :used_frames]).any():  # stored rotated: the change
            cache_cos, cache_sin = time_rotation(cfg, np.repeat(moved, t, axis=1), dev)
        chunk_cos, chunk_sin = time_rotation(cfg, np.repeat(own, t, axis=1), dev)  # (B, F*T)

        ph, pw = cfg.patch_size[1:]
        space_cos, space_sin = space_rotation(cfg, f, self.height // ph, self.width // pw, dev)

        mask = None
        if not valid[:, :used_frames].all():
            tok = np.repeat(valid[:, :used_frames], t, axis=1)
            full = np.concatenate((tok, np.ones((len(slots), f * t), dtype=bool)), 1)
            mask = torch.from_numpy(full).to(dev)[:, None, None, :]

        wpos = np.vectorize(self.position, otypes=[np.int64])(starts[:, None] + np.arange(f)[None, :])  # (B, F)
        wtok = (wpos[:, :, None] * t + np.arange(t)[None, None, :]).reshape(len(slots), f * t)
        return WanChunkContext(
            cache=self, slots=list(slots), start_frames=starts, num_frames=f,
            slot_index=torch.as_tensor(slots, dtype=torch.long, device=dev), used=used_frames * t,
            cache_positions=pos[:, :used_frames], cache_valid=valid[:, :used_frames], rope_positions=own,
            keys_rotated=absolute, cache_cos=cache_cos, cache_sin=cache_sin, chunk_cos=chunk_cos, chunk_sin=chunk_sin,
            space_cos=space_cos, space_sin=space_sin,
            mask=mask, write_tokens=torch.from_numpy(wtok).to(dev), write_positions=wpos,
        )

    def read(self, layer: int, ctx: WanChunkContext, k_own: torch.Tensor | None = None,
             v_own: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's cached keys, time-rotated for this chunk, and values: (B, used, H, D);
        with the chunk's own keys/values (B, F*T, H, D) given, those follow in the same
        buffers, (B, used + F*T, H, D), as attention takes them (one copy, no concatenation)."""
        n, own = ctx.used, 0 if k_own is None else k_own.shape[1]
        dtype = self.k.dtype if k_own is None else k_own.dtype
        shape = (ctx.batch, n + own, *self.k.shape[3:])
        k, v = self.k.new_empty(shape, dtype=dtype), self.v.new_empty(shape, dtype=dtype)
        k[:, :n] = self.k[layer, ctx.slot_index, :n]  # (B, used, H, D)
        v[:, :n] = self.v[layer, ctx.slot_index, :n]
        if ctx.cache_cos is not None and ctx.cache_sin is not None:
            rotate_(k[:, :n], ctx.cache_cos, ctx.cache_sin)
        if k_own is not None and v_own is not None:
            k[:, n:] = k_own
            v[:, n:] = v_own
        return k, v

    def write(self, layer: int, ctx: WanChunkContext, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store one layer's keys (rotated in space, and in time where ``ctx.keys_rotated``) and
        values (B, F*T, H, D) of the chunk. The
        commit pass calls it after that layer's attention, so the chunk never reads frames it
        evicts; ``advance`` then moves the cursors."""
        rows = ctx.slot_index[:, None]
        self.k[layer, rows, ctx.write_tokens] = k.to(self.k.dtype)
        self.v[layer, rows, ctx.write_tokens] = v.to(self.v.dtype)

    def advance(self, ctx: WanChunkContext, x0: torch.Tensor) -> None:
        """After every layer is written: record the chunk's frames and clean latents
        x0 (B, C, F, h, w) and expect the next chunk."""
        f = ctx.num_frames
        frames = ctx.start_frames[:, None] + np.arange(f)[None, :]  # (B, F)
        rows = np.asarray(ctx.slots)[:, None]
        self.frame_at[rows, ctx.write_positions] = frames
        self.next_frame[ctx.slots] = ctx.start_frames + f
        pos = torch.from_numpy(ctx.write_positions).to(self.latents.device)
        self.latents[ctx.slot_index[:, None], pos] = x0.transpose(1, 2).to(self.latents.dtype)


def time_rotation(cfg: WanConfig, positions: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (B, N, 1, Pt) of the time pairs of RoPE at integer ``positions`` (B, N)."""
    inv = rope_frequencies(cfg, cfg.rope_pairs[0])  # (Pt,) float64
    ang = torch.from_numpy(positions).to(torch.float64)[..., None] * inv  # (B, N, Pt)
    return ang.cos().float()[:, :, None].to(device), ang.sin().float()[:, :, None].to(device)


def space_rotation(
    cfg: WanConfig, frames: int, h: int, w: int, device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (1, F*h*w, 1, Ph+Pw) of the height then width pairs of RoPE for each token
    (f, y, x) of F frames of h x w tokens, frame-major: fixed per token, whatever the time."""
    _, ph, pw = cfg.rope_pairs
    ay = torch.arange(h, dtype=torch.float64)[:, None] * rope_frequencies(cfg, ph)  # (h, Ph)
    ax = torch.arange(w, dtype=torch.float64)[:, None] * rope_frequencies(cfg, pw)  # (w, Pw)
    ang = torch.cat((ay[:, None].expand(h, w, ph), ax[None].expand(h, w, pw)), -1)  # (h, w, Ph+Pw)
    ang = ang.reshape(1, h * w, 1, ph + pw).repeat(1, frames, 1, 1)  # (1, F*h*w, 1, Ph+Pw)
    return ang.cos().float().to(device), ang.sin().float().to(device)


def rope_frequencies(cfg: WanConfig, pairs: int) -> torch.Tensor:
    """Wan's per-pair frequencies for an axis given ``pairs`` rotary pairs: theta^(-2i / 2*pairs)."""
    return 1.0 / cfg.rope_theta ** (torch.arange(pairs, dtype=torch.float64) / pairs)


def rotate_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """``rotate`` of the first P pairs (the time pairs), in place."""
    p = cos.shape[-1]
    part = x[..., : 2 * p].unflatten(-1, (p, 2))  # (B, N, H, P, 2), a view of x
    a, b = part[..., 0].float(), part[..., 1].float()  # views when x is float32: both results first
    a_rot, b_rot = a * cos - b * sin, a * sin + b * cos
    part[..., 0] = a_rot
    part[..., 1] = b_rot


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, first_pair: int) -> torch.Tensor:
    """Rotate the adjacent pairs ``first_pair .. first_pair + P - 1`` of the head dim of
    x (B, N, H, D) by angles given as cos, sin (B or 1, N, 1, P); other pairs pass through."""
    p = cos.shape[-1]
    lo, hi = 2 * first_pair, 2 * (first_pair + p)
    part = x[..., lo:hi].float().unflatten(-1, (p, 2))  # (B, N, H, P, 2)
    a, b = part[..., 0], part[..., 1]
    rot = torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2).to(x.dtype)
    return torch.cat((x[..., :lo], rot, x[..., hi:]), -1)
