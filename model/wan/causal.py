"""The Wan2.1 causal transformer, top to bottom: embeddings, RoPE, attention, block, head, model.

This is Wan2.1-T2V's DiT (Self-Forcing, CausVid, LongLive and Rolling Forcing fine-tune it to
run chunk by chunk) with block-causal self-attention over a KV cache of sink frames and a
rolling window (``model/wan/cache.py``: its layout and the RoPE position scheme). Submodule
names are the authors' checkpoint keys (``patch_embedding``, ``blocks.N.self_attn.q``, ...),
so their state dicts load as they are (``model/wan/weights.py``).

A latent video is (B, C, F, H, W). A token is one latent frame's 2x2 patch: T = H/2 * W/2
tokens a frame (1,560 at 480x832), and each frame has its own timestep, so a token is
modulated by its frame's time embedding.

RoPE as Wan does it: the head dim's adjacent pairs are split between time, height and width
(22, 21, 21 of 64 pairs at head dim 128), with base 10000 on each axis. A token's height and
width rotations are fixed; its time rotation comes from the chunk context (absolute or rank
positions, as the recipe says; ``model/wan/cache.py``). Attention is ``model/attention.attend``: flash-attn
on CUDA when installed and nothing is masked, SDPA otherwise.

Per chunk, the runner calls::

    text = model.text_kv(context)                 # once per prompt, kept with the session
    ctx = cache.chunk(slots)                      # once per chunk: host-side positions
    x0 = generate_chunk(model, ctx, text, noise)  # model/wan/sampler.py, which runs
        # for each step: v = model.denoise(x_t, t, text, ctx); x0 = x_t - sigma v; renoise
        # then model.commit(x0, text, ctx): writes the chunk's K/V, advances the cursors

and on a prompt change or a migration ``model.recache(cache, slot, latents, frame_ids, text)``
with the frames ``cache.held(slot)`` returns (or a snapshot carried).

Matrix-Game 2.0 (``cfg.model_type == "i2v"``, ``model/wan/action.py``) is the same model with
three differences: the cross-attention attends to CLIP image tokens through ``img_emb`` (no
text: ``image_kv`` instead of ``text_kv``), each chunk's latents go in with the image condition
beside them (``cond``: 4 mask channels and the image's latent, 36 channels in all), and the
first blocks hold an ``ActionModule`` after the cross-attention, fed per chunk by an
``ActionContext`` (``act``) whose caches share this cache's slots and cursors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from worldserve.model.attention import attend
from worldserve.model.wan.action import ActionContext, ActionModule
from worldserve.model.wan.cache import WanChunkContext, WanKVCache, rotate, space_rotation
from worldserve.model.wan.config import WanConfig


@dataclass(slots=True)
class TextKV:
    """Cross-attention keys and values of a batch of prompts (or, for Matrix-Game, of anchor
    images), every layer: computed once per prompt by ``CausalWanModel.text_kv`` (or
    ``image_kv``) and passed to every step."""

    k: torch.Tensor  # (L, B, text_len, H, D)
    v: torch.Tensor  # (L, B, text_len, H, D)

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @staticmethod
    def cat(parts: Sequence[TextKV]) -> TextKV:
        """Stack the prompts of several sessions into one batch (rows in the given order)."""
        return TextKV(torch.cat([p.k for p in parts], 1), torch.cat([p.v for p in parts], 1))

    def row(self, b: int) -> TextKV:
        """The prompt of batch row ``b`` as a batch of one."""
        return TextKV(self.k[:, b:b + 1], self.v[:, b:b + 1])


# ---------------------------------------------------------------------------- pieces


def timestep_embedding(dim: int, t: torch.Tensor) -> torch.Tensor:
    """Wan's sinusoidal embedding of timesteps t (N,) -> (N, dim), cosines first, in float64."""
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64, device=t.device) / half)
    ang = t.to(torch.float64)[:, None] * freqs[None]  # (N, half)
    return torch.cat((ang.cos(), ang.sin()), 1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class LayerNorm(nn.LayerNorm):
    """LayerNorm computed in float32 (Wan's norm1/norm2 have no weights; norm3 does)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = None if self.weight is None else self.weight.float()
        b = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).type_as(x)


@dataclass(slots=True)
class Grid:
    """Token layout of one forward: F frames of h x w tokens, and the space rotation of each."""

    frames: int
    h: int
    w: int
    cos: torch.Tensor  # (1, F*h*w, 1, Ph+Pw) height pairs then width pairs
    sin: torch.Tensor

    @property
    def tokens_per_frame(self) -> int:
        return self.h * self.w


def space_grid(cfg: WanConfig, frames: int, h: int, w: int, device: torch.device | str) -> Grid:
    """The layout of F frames of h x w tokens and their height/width rotations."""
    return Grid(frames, h, w, *space_rotation(cfg, frames, h, w, device))


# ---------------------------------------------------------------------------- attention


class SelfAttention(nn.Module):
    """Block-causal self-attention of a chunk over [cached sinks + window | itself]."""

    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.time_pairs = cfg.rope_pairs[0]
        self.q = nn.Linear(cfg.dim, cfg.dim)
        self.k = nn.Linear(cfg.dim, cfg.dim)
        self.v = nn.Linear(cfg.dim, cfg.dim)
        self.o = nn.Linear(cfg.dim, cfg.dim)
        self.norm_q = RMSNorm(cfg.dim, cfg.eps) if cfg.qk_norm else nn.Identity()
        self.norm_k = RMSNorm(cfg.dim, cfg.eps) if cfg.qk_norm else nn.Identity()

    def forward(self, x: torch.Tensor, grid: Grid, ctx: WanChunkContext, layer: int, write: bool) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.norm_q(self.q(x)).view(b, n, self.heads, self.head_dim)  # (B, F*T, H, D)
        k = self.norm_k(self.k(x)).view(b, n, self.heads, self.head_dim)
        v = self.v(x).view(b, n, self.heads, self.head_dim)
        q = rotate(q, grid.cos, grid.sin, self.time_pairs)  # space: pairs after the time pairs
        k = rotate(k, grid.cos, grid.sin, self.time_pairs)
        q_t = rotate(q, ctx.chunk_cos, ctx.chunk_sin, 0)  # time: the first pairs
        k_t = rotate(k, ctx.chunk_cos, ctx.chunk_sin, 0)
        k_all, v_all = ctx.cache.read(layer, ctx, k_t, v)  # (B, used + F*T, H, D): cache, then own
        y = attend(q_t, k_all, v_all, ctx.mask)  # (B, F*T, H, D)
        if write:  # after this layer's attention: the chunk never reads what it evicts
            ctx.cache.write(layer, ctx, k_t if ctx.keys_rotated else k, v)
        return self.o(y.flatten(2))


class CrossAttention(nn.Module):
    """Attention of every token over the prompt's cached keys/values (no RoPE, no mask: Wan
    attends to all text_len positions, the zero padding included)."""

    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.q = nn.Linear(cfg.dim, cfg.dim)
        self.k = nn.Linear(cfg.dim, cfg.dim)
        self.v = nn.Linear(cfg.dim, cfg.dim)
        self.o = nn.Linear(cfg.dim, cfg.dim)
        self.norm_q = RMSNorm(cfg.dim, cfg.eps) if cfg.qk_norm else nn.Identity()
        self.norm_k = RMSNorm(cfg.dim, cfg.eps) if cfg.qk_norm else nn.Identity()

    def kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """context (B, text_len, dim) -> k, v (B, text_len, H, D)."""
        b, n, _ = context.shape
        k = self.norm_k(self.k(context)).view(b, n, self.heads, self.head_dim)
        return k, self.v(context).view(b, n, self.heads, self.head_dim)

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.norm_q(self.q(x)).view(b, n, self.heads, self.head_dim)  # (B, F*T, H, D)
        return self.o(attend(q, k, v, None).flatten(2))


# ---------------------------------------------------------------------------- block, head


class Block(nn.Module):
    def __init__(self, cfg: WanConfig, index: int = 0):
        super().__init__()
        self.norm1 = LayerNorm(cfg.dim, eps=cfg.eps, elementwise_affine=False)
        self.self_attn = SelfAttention(cfg)
        self.norm3 = LayerNorm(cfg.dim, eps=cfg.eps) if cfg.cross_attn_norm else nn.Identity()
        self.cross_attn = CrossAttention(cfg)
        self.norm2 = LayerNorm(cfg.dim, eps=cfg.eps, elementwise_affine=False)
        self.ffn = nn.Sequential(
            nn.Linear(cfg.dim, cfg.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn_dim, cfg.dim)
        )
        self.modulation = nn.Parameter(torch.randn(1, 6, cfg.dim) / cfg.dim**0.5)
        a = cfg.action_config
        self.action_model = ActionModule(a) if a is not None and index in a.blocks else None
        self.action_index = a.blocks.index(index) if self.action_model is not None and a is not None else -1

    def forward(
        self, x: torch.Tensor, e: torch.Tensor, grid: Grid, ctx: WanChunkContext, layer: int,
        text_k: torch.Tensor, text_v: torch.Tensor, write: bool, act: ActionContext | None = None,
    ) -> torch.Tensor:
        """x (B, F*T, dim); e (B, F, 6, dim) the frames' time projections; ``act`` the chunk's
        actions where the block has an action module."""
        b, f, t = x.shape[0], grid.frames, grid.tokens_per_frame
        mod = (self.modulation.unsqueeze(1) + e).float()  # (B, F, 6, dim)
        shift1, scale1, gate1, shift2, scale2, gate2 = (m.unsqueeze(2) for m in mod.unbind(2))  # (B, F, 1, dim)

        def per_frame(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, f, t, -1)  # (B, F, T, dim)

        h = (per_frame(self.norm1(x)) * (1 + scale1) + shift1).flatten(1, 2).type_as(x)
        x = x + (per_frame(self.self_attn(h, grid, ctx, layer, write)) * gate1).flatten(1, 2).type_as(x)
        x = x + self.cross_attn(self.norm3(x), text_k, text_v)
        if self.action_model is not None:
            if act is None:
                raise ValueError(f"block {layer} has an action module and the chunk came without actions")
            x = self.action_model(x, f, act, self.action_index, write)
        h = (per_frame(self.norm2(x)) * (1 + scale2) + shift2).flatten(1, 2).type_as(x)
        return x + (per_frame(self.ffn(h)) * gate2).flatten(1, 2).type_as(x)


class Head(nn.Module):
    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.norm = LayerNorm(cfg.dim, eps=cfg.eps, elementwise_affine=False)
        self.head = nn.Linear(cfg.dim, cfg.patch_dim)
        self.modulation = nn.Parameter(torch.randn(1, 2, cfg.dim) / cfg.dim**0.5)

    def forward(self, x: torch.Tensor, e: torch.Tensor, grid: Grid) -> torch.Tensor:
        """x (B, F*T, dim); e (B, F, dim) the frames' time embeddings -> (B, F*T, patch_dim)."""
        b, f, t = x.shape[0], grid.frames, grid.tokens_per_frame
        shift, scale = (self.modulation.unsqueeze(1) + e.unsqueeze(2)).float().unbind(2)  # (B, F, dim)
        h = self.norm(x).view(b, f, t, -1) * (1 + scale.unsqueeze(2)) + shift.unsqueeze(2)  # (B, F, T, dim)
        return self.head(h.flatten(1, 2).type_as(x))


# ---------------------------------------------------------------------------- model


class CausalWanModel(nn.Module):
    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embedding = nn.Conv3d(cfg.in_dim, cfg.dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        if cfg.model_type == "t2v":
            self.text_embedding = nn.Sequential(
                nn.Linear(cfg.text_dim, cfg.dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.dim, cfg.dim)
            )
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, cfg.dim), nn.SiLU(), nn.Linear(cfg.dim, cfg.dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(cfg.dim, 6 * cfg.dim))
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.head = Head(cfg)
        if cfg.model_type == "i2v":  # Wan's MLPProj of CLIP image tokens: keys img_emb.proj.{0,1,3,4}
            self.img_emb = nn.Module()
            self.img_emb.proj = nn.Sequential(
                nn.LayerNorm(cfg.image_dim), nn.Linear(cfg.image_dim, cfg.image_dim), nn.GELU(),
                nn.Linear(cfg.image_dim, cfg.dim), nn.LayerNorm(cfg.dim),
            )

    # --- prompts ---
    @torch.no_grad()
    def text_kv(self, context: torch.Tensor | Sequence[torch.Tensor]) -> TextKV:
        """Cross-attention K/V of prompts: ``context`` (B, L<=text_len, text_dim) or a list of
        (L_i, text_dim) embeddings, zero-padded to text_len as Wan does."""
        cfg = self.cfg
        if cfg.model_type != "t2v":
            raise ValueError(f"a {cfg.model_type} model takes image tokens (image_kv), not prompts")
        rows = list(context) if not isinstance(context, torch.Tensor) else list(context.unbind(0))
        for i, c in enumerate(rows):
            if c.dim() != 2 or c.shape[1] != cfg.text_dim or c.shape[0] > cfg.text_len:
                raise ValueError(
                    f"prompt {i}: embedding {tuple(c.shape)} is not (<= {cfg.text_len}, {cfg.text_dim})"
                )
        w = self.text_embedding[0].weight
        padded = torch.zeros(len(rows), cfg.text_len, cfg.text_dim, dtype=w.dtype, device=w.device)
        for i, c in enumerate(rows):
            padded[i, : c.shape[0]] = c.to(w.dtype)
        return self._context_kv(self.text_embedding(padded))  # (L, B, text_len, H, D)

    @torch.no_grad()
    def image_kv(self, tokens: torch.Tensor) -> TextKV:
        """Cross-attention K/V of anchor images (Matrix-Game): CLIP tokens (B, N, image_dim), the
        penultimate layer's 257 tokens of CLIP ViT-H/14 (model/wan/clip.py), through img_emb."""
        cfg = self.cfg
        if cfg.model_type != "i2v":
            raise ValueError("a t2v model takes prompts (text_kv), not image tokens")
        if tokens.dim() != 3 or tokens.shape[2] != cfg.image_dim:
            raise ValueError(f"image tokens {tuple(tokens.shape)} are not (B, N, {cfg.image_dim})")
        w = self.img_emb.proj[1].weight
        return self._context_kv(self.img_emb.proj(tokens.to(w.device, w.dtype)))  # (L, B, N, H, D)

    def _context_kv(self, context: torch.Tensor) -> TextKV:
        kv = [blk.cross_attn.kv(context) for blk in self.blocks]  # context (B, N, dim)
        return TextKV(torch.stack([k for k, _ in kv]), torch.stack([v for _, v in kv]))

    # --- one chunk ---
    def _forward(self, x: torch.Tensor, t: torch.Tensor, text: TextKV, ctx: WanChunkContext, write: bool,
                 cond: torch.Tensor | None = None, act: ActionContext | None = None) -> torch.Tensor:
        cfg = self.cfg
        b, c, f, hh, ww = x.shape
        cache = ctx.cache
        if c != cfg.out_dim or f != ctx.num_frames or (hh, ww) != (cache.height, cache.width) or b != ctx.batch:
            raise ValueError(
                f"latents {tuple(x.shape)} do not match the chunk: ({ctx.batch}, {cfg.out_dim}, "
                f"{ctx.num_frames}, {cache.height}, {cache.width}) expected"
            )
        if cfg.cond_dim:  # the image condition goes in beside the latents (36 channels for Matrix-Game)
            if cond is None or tuple(cond.shape) != (b, cfg.cond_dim, f, hh, ww):
                got = None if cond is None else tuple(cond.shape)
                raise ValueError(f"image condition {got}, expected {(b, cfg.cond_dim, f, hh, ww)}")
            x = torch.cat((x, cond.to(x.device, x.dtype)), 1)
        if text.batch != b:
            raise ValueError(f"text K/V holds {text.batch} prompts for a batch of {b} chunks")
        t = t.to(x.device, torch.float32)
        t = t[:, None].expand(b, f) if t.dim() == 1 else t
        if t.shape != (b, f):
            raise ValueError(f"timesteps {tuple(t.shape)} are neither ({b},) nor ({b}, {f})")

        x = x.to(self.patch_embedding.weight.dtype)
        x = self.patch_embedding(x)  # (B, dim, F, h, w)
        grid = Grid(f, x.shape[3], x.shape[4], ctx.space_cos, ctx.space_sin)  # (B, dim, F, h, w) tokens
        x = x.flatten(2).transpose(1, 2)  # (B, F*h*w, dim)
        e = self.time_embedding(timestep_embedding(cfg.freq_dim, t.reshape(-1)).to(x.dtype))  # (B*F, dim)
        e6 = self.time_projection(e).view(b, f, 6, cfg.dim)  # (B, F, 6, dim)
        for i, blk in enumerate(self.blocks):
            x = blk(x, e6, grid, ctx, i, text.k[i], text.v[i], write, act)
        out = self.head(x, e.view(b, f, cfg.dim), grid)  # (B, F*h*w, patch_dim)
        pf, ph, pw = cfg.patch_size
        out = out.view(b, f, grid.h, grid.w, pf, ph, pw, cfg.out_dim)
        out = out.permute(0, 7, 1, 4, 2, 5, 3, 6)  # (B, C, F, pf, h, ph, w, pw)
        return out.reshape(b, cfg.out_dim, f * pf, grid.h * ph, grid.w * pw).float()

    @torch.no_grad()
    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, text: TextKV, ctx: WanChunkContext,
                cond: torch.Tensor | None = None, act: ActionContext | None = None) -> torch.Tensor:
        """Flow prediction v = noise - x0 for a batch of chunks, without writing the cache.

        x_t (B, C, F, H, W) latents (C = out_dim); t (B,) or (B, F) model timesteps (per frame);
        text with B rows; ctx from ``cache.chunk``; for Matrix-Game the image condition
        ``cond`` (B, cond_dim, F, H, W) and the actions ``act``. Returns (B, out_dim, F, H, W)
        float32."""
        return self._forward(x_t, t, text, ctx, False, cond, act)

    @torch.no_grad()
    def commit(self, x0: torch.Tensor, text: TextKV, ctx: WanChunkContext,
               cond: torch.Tensor | None = None, act: ActionContext | None = None) -> torch.Tensor:
        """Run the clean chunk at ``cfg.commit_timestep`` and write its K/V (and the action
        modules') into each row's slot; the slots' cursors advance by the chunk's frames.
        ``ctx`` is spent afterwards. Returns that pass's flow prediction (B, out_dim, F, H, W),
        which serving ignores."""
        t = torch.full((x0.shape[0],), self.cfg.commit_timestep, device=x0.device)
        out = self._forward(x0, t, text, ctx, True, cond, act)
        ctx.cache.advance(ctx, x0)
        return out

    @torch.no_grad()
    def recache_jointly(self, cache: WanKVCache, slot: int, latents: torch.Tensor, frame_ids: Sequence[int],
                        text: TextKV, keep_sinks: bool) -> None:
        """LongLive's re-cache after a prompt switch: the frames (C, N, H, W), epoch ids
        ``frame_ids`` (consecutive), go through one commit pass together, each attending to
        all of them (no causal order among them) and to the slot's sinks as they are
        (``keep_sinks``: their keys and values stay those of the old prompt); the slot then
        holds the sinks and the latest ``window_frames`` of the frames. Without ``keep_sinks``
        the frames start at 0 and include the sinks, which are recomputed with the rest."""
        cfg = self.cfg
        ids = [int(i) for i in frame_ids]
        if latents.dim() != 4 or latents.shape[1] != len(ids) or not ids or ids != list(range(ids[0], ids[-1] + 1)):
            raise ValueError(
                f"slot {slot}: latents {tuple(latents.shape)} and frame ids {ids} are not N consecutive frames")
        if keep_sinks == (ids[0] == 0) and cfg.sink_frames:
            raise ValueError(f"slot {slot}: frames from {ids[0]} with keep_sinks={keep_sinks}")
        scratch = WanKVCache.create(cfg.with_recipe(window_frames=max(len(ids), cfg.chunk_frames)), cache.height,
                                    cache.width, 1, cache.k.dtype, cache.k.device)
        tmp = scratch.allocate()
        sinks = list(range(min(cfg.sink_frames, ids[-1] + 1)))
        if keep_sinks:
            scratch.take(tmp, cache, slot, sinks)
        scratch.seek(tmp, ids[0])
        self.commit(latents[None], text, scratch.chunk([tmp], num_frames=len(ids)))
        cache.reset(slot)
        window = [g for g in ids[-cfg.window_frames:] if g >= cfg.sink_frames]
        cache.take(slot, scratch, tmp, [*sinks, *window])

    @torch.no_grad()
    def recache(self, cache: WanKVCache, slot: int, latents: torch.Tensor, frame_ids: Sequence[int] | np.ndarray,
                text: TextKV, inputs: Callable[[WanChunkContext], dict] | None = None) -> None:
        """Rebuild one slot's cache from clean latent frames under (new) text K/V: the slot is
        emptied, then the frames are committed chunk by chunk, grouped as they were generated
        (by ``frame // chunk_frames``). latents (C, N, H, W); frame_ids (N,) ascending epoch
        frame indices (the sinks then the window, as ``cache.held(slot)`` returns them);
        text with one row; ``inputs(ctx)`` gives the commit's ``cond`` and ``act`` of each
        re-committed group (Matrix-Game). Afterwards the slot expects frame ``frame_ids[-1] + 1``."""
        ids = np.asarray(frame_ids, dtype=np.int64)
        if latents.dim() != 4 or latents.shape[1] != len(ids):
            raise ValueError(f"slot {slot}: latents {tuple(latents.shape)} do not hold {len(ids)} frames (C, N, H, W)")
        if len(ids) == 0:
            raise ValueError(f"slot {slot}: no frames to re-cache")
        if (np.diff(ids) <= 0).any() or ids[0] < 0:
            raise ValueError(f"slot {slot}: frame ids {ids.tolist()} are not ascending and >= 0")
        if text.batch != 1:
            raise ValueError(f"slot {slot}: re-cache takes one prompt, got {text.batch}")
        cache._check_slot(slot)
        cache.reset(slot)
        groups = ids // self.cfg.chunk_frames
        start = 0
        while start < len(ids):
            end = start + 1
            while end < len(ids) and groups[end] == groups[start] and ids[end] == ids[end - 1] + 1:
                end += 1
            cache.seek(slot, int(ids[start]))
            ctx = cache.chunk([slot], num_frames=end - start)
            self.commit(latents[None, :, start:end], text, ctx, **(inputs(ctx) if inputs else {}))
            start = end
