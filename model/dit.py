"""The causal few-step world model, top to bottom: conditioning, attention, MLP, block, model.

Pixel space, no VAE. A frame of ``bucket``² pixels is cut into (bucket/patch)² tokens. Each
token sees its patch of the noisy frame *and* of the previous clean frame (the stem), plus the
frame's action and scene vectors. Conditioning (noise level + action + scene) also reaches
every block through adaLN. Attention is block-causal with 2-D RoPE in space and a relative
time rotation (``model/rope.py``): a chunk sees itself, the sink frames and the window.

The head predicts the clean frame as a per-token motion kernel applied to the previous frame
(separable, ±radius pixels in y and x: the shift the action causes) plus a residual for what
the shift cannot explain (new terrain at the edges, things that move on their own).

Explicit steps, no whole-video API:
- ``denoise_chunk``: one denoising forward of a chunk against its cached context -> x0 guess;
- ``commit_chunk``: the clean chunk at noise 0 -> per-layer keys/values for the cache;
- ``forward_sequence``: every frame of a sequence in one pass with the block-causal mask
  (training, re-caching after a scene/bucket change or a restore, and the equality tests);
- ``decode``: clean frames in [-1, 1] -> uint8 pixels (the whole "decoder": a clamp).

Frames are (B, F, C, H, W) floats in [-1, 1]; "no previous frame" is all zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import attend
from model.config import ModelConfig
from model.rope import Rope, RopeTables


@dataclass(slots=True)
class ChunkContext:
    """What a chunk attends to besides itself, built once per chunk by the KV cache."""

    k: torch.Tensor  # (L, B, Nc, H, D) cached keys, rotated in space and time
    v: torch.Tensor  # (L, B, Nc, H, D)
    mask: torch.Tensor | None  # (B, 1, 1, Nc + Tq) bool, True = attend; None = all valid
    rope_q: Rope  # time rotation of the chunk's queries, (Tq, D)
    rope_k: Rope  # time rotation of the chunk's own keys, (B, Tq, D): sink frames zeroed


# ---------------------------------------------------------------------------- conditioning


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, frames: int) -> torch.Tensor:
    """adaLN: x (B, F*T, W) with per-frame shift/scale (B, F, W)."""
    b, n, w = x.shape
    x = x.view(b, frames, n // frames, w)  # (B, F, T, W)
    x = x * (1 + scale[:, :, None]) + shift[:, :, None]
    return x.view(b, n, w)


def gated(x: torch.Tensor, gate: torch.Tensor, frames: int) -> torch.Tensor:
    b, n, w = x.shape
    return (x.view(b, frames, n // frames, w) * gate[:, :, None]).view(b, n, w)


class NoiseEmbed(nn.Module):
    """Noise level in [0, 1] -> sinusoidal features -> MLP."""

    def __init__(self, width: int, freq_dim: int = 64):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, width), nn.SiLU(), nn.Linear(width, width))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=t.device) / half)
        args = (t.float() * 1000.0)[..., None] * freqs  # (..., half)
        feats = torch.cat((torch.cos(args), torch.sin(args)), -1).to(self.mlp[0].weight.dtype)
        return self.mlp(feats)


# ---------------------------------------------------------------------------- attention, MLP


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.q_norm = nn.RMSNorm(cfg.head_dim, eps=1e-6)
        self.k_norm = nn.RMSNorm(cfg.head_dim, eps=1e-6)
        self.proj = nn.Linear(cfg.width, cfg.width)

    def keys_values(
        self, x: torch.Tensor, rope_sp: Rope
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (time-unrotated), k_store (rotated in space only), v; each (B, T, H, D)."""
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).unbind(2)
        q = rope_sp.apply(self.q_norm(q))
        k = rope_sp.apply(self.k_norm(k))
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        rope_sp: Rope,
        rope_tq: Rope,
        rope_tk: Rope,
        ctx_kv: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, W) -> (out (B, T, W), k_store, v) with k_store/v (B, T, H, D)."""
        b, n, w = x.shape
        q, k_store, v = self.keys_values(x, rope_sp)
        q = rope_tq.apply(q)
        k = rope_tk.apply(k_store)
        if ctx_kv is not None:
            k = torch.cat((ctx_kv[0], k), 1)  # (B, Nc + T, H, D)
            v_all = torch.cat((ctx_kv[1], v), 1)
        else:
            v_all = v
        o = attend(q, k, v_all, mask)  # (B, T, H, D)
        return self.proj(o.reshape(b, n, w)), k_store, v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = int(cfg.mlp_ratio * cfg.width)
        self.fc1 = nn.Linear(cfg.width, hidden)
        self.fc2 = nn.Linear(hidden, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


# ---------------------------------------------------------------------------- block


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.width, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.width, elementwise_affine=False, eps=1e-6)
        self.mlp = MLP(cfg)
        self.ada = nn.Linear(cfg.width, 6 * cfg.width)  # adaLN-Zero: shift/scale/gate x2

    def forward(
        self,
        x: torch.Tensor,
        c: torch.Tensor,
        frames: int,
        ropes: tuple[Rope, Rope, Rope],
        ctx_kv: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, F*T, W), c (B, F, W) -> x, k_store, v."""
        sh1, sc1, g1, sh2, sc2, g2 = self.ada(c).chunk(6, -1)  # each (B, F, W)
        h, k, v = self.attn(modulate(self.norm1(x), sh1, sc1, frames), *ropes, ctx_kv, mask)
        x = x + gated(h, g1, frames)
        x = x + gated(self.mlp(modulate(self.norm2(x), sh2, sc2, frames)), g2, frames)
        return x, k, v

    def keys_values_only(
        self, x: torch.Tensor, c: torch.Tensor, frames: int, rope_sp: Rope
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The commit pass needs only the last block's keys/values."""
        sh1, sc1 = self.ada(c).chunk(6, -1)[:2]
        _, k, v = self.attn.keys_values(modulate(self.norm1(x), sh1, sc1, frames), rope_sp)
        return k, v


# ---------------------------------------------------------------------------- model


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """(B, F, C, H, W) -> (B, F*T, C*p*p), tokens in raster order per frame."""
    b, f, c, h, w = x.shape
    x = x.view(b, f, c, h // p, p, w // p, p).permute(0, 1, 3, 5, 2, 4, 6)  # (B,F,gh,gw,C,p,p)
    return x.reshape(b, f * (h // p) * (w // p), c * p * p)


def unpatchify(x: torch.Tensor, frames: int, c: int, p: int, g: int) -> torch.Tensor:
    """(B, F*T, C*p*p) -> (B, F, C, H, W)."""
    b = x.shape[0]
    x = x.view(b, frames, g, g, c, p, p).permute(0, 1, 4, 2, 5, 3, 6)  # (B,F,C,gh,p,gw,p)
    return x.reshape(b, frames, c, g * p, g * p)


def shift_warp(prev: torch.Tensor, ky: torch.Tensor, kx: torch.Tensor, radius: int, p: int) -> torch.Tensor:
    """Apply per-token separable shift kernels to the previous frame.

    prev (N, C, H, W); ky, kx (N, gh, gw, taps) softmax weights over offsets -r..r.
    out(y, x) = sum_ij ky[j] kx[i] prev(y + j - r, x + i - r), edges replicated.
    """
    wx = kx.repeat_interleave(p, 1).repeat_interleave(p, 2)  # (N, H, W, taps)
    wy = ky.repeat_interleave(p, 1).repeat_interleave(p, 2)
    padded = F.pad(prev, (radius, radius, 0, 0), mode="replicate")
    out = torch.einsum("nchwk,nhwk->nchw", padded.unfold(3, 2 * radius + 1, 1), wx)
    padded = F.pad(out, (0, 0, radius, radius), mode="replicate")
    return torch.einsum("nchwk,nhwk->nchw", padded.unfold(2, 2 * radius + 1, 1), wy)


class WorldModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        w, c, p = cfg.width, cfg.channels, cfg.patch
        self.noise_embed = NoiseEmbed(w)
        self.action_cond = nn.Linear(cfg.action_dim, w)
        self.scene_cond = nn.Linear(cfg.scene_dim, w)
        self.action_token = nn.Linear(cfg.action_dim, w)
        self.scene_token = nn.Linear(cfg.scene_dim, w)
        self.stems = nn.ModuleDict({f"b{b}": nn.Linear(2 * c * p * p, w) for b in cfg.buckets})
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.final_norm = nn.LayerNorm(w, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Linear(w, 2 * w)
        self.heads = nn.ModuleDict(
            {f"b{b}": nn.Linear(w, c * p * p + 2 * (2 * cfg.radius(b) + 1)) for b in cfg.buckets}
        )
        # The action's direct say in the motion kernels: a linear map from the action to the
        # kernel logits can place a peak at the shift the action causes (logits quadratic in
        # the offset, linear in the action), so the camera motion is learned in a few steps.
        self.motion_prior = nn.ModuleDict(
            {f"b{b}": nn.Linear(cfg.action_dim, 2 * (2 * cfg.radius(b) + 1)) for b in cfg.buckets}
        )
        self.rope = RopeTables(cfg)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        for blk in self.blocks:  # adaLN-Zero: every block starts as the identity
            nn.init.zeros_(blk.ada.weight)
            nn.init.zeros_(blk.ada.bias)
        nn.init.zeros_(self.final_ada.weight)
        nn.init.zeros_(self.final_ada.bias)
        for head in [*self.heads.values(), *self.motion_prior.values()]:
            nn.init.zeros_(head.weight)  # start as "copy the previous frame"
            nn.init.zeros_(head.bias)

    # --- pieces shared by every path ---

    def _embed(
        self, x: torch.Tensor, prev: torch.Tensor, noise: torch.Tensor, actions: torch.Tensor,
        scene: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens (B, F*T, W) and per-frame conditioning (B, F, W).

        x, prev (B, F, C, H, W); noise (B, F); actions (B, F, A); scene (B, S).
        """
        b, f, _, h, _ = x.shape
        p = self.cfg.patch
        tokens = self.stems[f"b{h}"](patchify(torch.cat((x, prev), 2), p))  # (B, F*T, W)
        per_frame = self.action_token(actions) + self.scene_token(scene)[:, None]  # (B, F, W)
        t = tokens.shape[1] // f
        tokens = (tokens.view(b, f, t, -1) + per_frame[:, :, None]).view(b, f * t, -1)
        c = self.noise_embed(noise) + self.action_cond(actions) + self.scene_cond(scene)[:, None]
        return tokens, F.silu(c)

    def _head(
        self, x: torch.Tensor, c: torch.Tensor, prev: torch.Tensor, actions: torch.Tensor
    ) -> torch.Tensor:
        """Final tokens -> clean-frame guess (B, F, C, H, W)."""
        b, f, ch, h, w = prev.shape
        cfg, p = self.cfg, self.cfg.patch
        g, r = h // p, cfg.radius(h)
        shift, scale = self.final_ada(c).chunk(2, -1)
        out = self.heads[f"b{h}"](modulate(self.final_norm(x), shift, scale, f))  # (B, F*T, O)
        resid = unpatchify(out[..., : ch * p * p], f, ch, p, g)
        taps = 2 * r + 1
        logits = out[..., ch * p * p :].reshape(b * f, g, g, 2, taps)
        prior = self.motion_prior[f"b{h}"](actions).reshape(b * f, 1, 1, 2, taps)
        kern = (logits + prior).float().softmax(-1)
        moved = shift_warp(prev.reshape(b * f, ch, h, w).float(), kern[..., 0, :], kern[..., 1, :], r, p)
        return moved.view(b, f, ch, h, w).to(resid.dtype) + resid

    # --- cached, chunk-by-chunk steps ---

    def denoise_chunk(
        self, x: torch.Tensor, prev: torch.Tensor, noise_level: float, actions: torch.Tensor,
        scene: torch.Tensor, ctx: ChunkContext,
    ) -> torch.Tensor:
        """One denoising forward: noisy chunk (B, F, C, H, W) at ``noise_level`` -> x0 guess."""
        b, f = x.shape[:2]
        noise = torch.full((b, f), noise_level, device=x.device)
        tokens, c = self._embed(x, prev, noise, actions, scene)
        rope_sp = self.rope.spatial_frames(x.shape[-1], f, tokens.dtype)
        for i, blk in enumerate(self.blocks):
            tokens, _, _ = blk(tokens, c, f, (rope_sp, ctx.rope_q, ctx.rope_k), (ctx.k[i], ctx.v[i]), ctx.mask)
        return self._head(tokens, c, prev, actions)

    def commit_chunk(
        self, x: torch.Tensor, prev: torch.Tensor, actions: torch.Tensor, scene: torch.Tensor,
        ctx: ChunkContext,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The clean chunk at noise 0 -> keys, values (L, B, F*T, H, D) for the cache."""
        b, f = x.shape[:2]
        tokens, c = self._embed(x, prev, torch.zeros(b, f, device=x.device), actions, scene)
        rope_sp = self.rope.spatial_frames(x.shape[-1], f, tokens.dtype)
        ks, vs = [], []
        last = len(self.blocks) - 1
        for i, blk in enumerate(self.blocks):
            if i == last:
                k, v = blk.keys_values_only(tokens, c, f, rope_sp)
            else:
                tokens, k, v = blk(tokens, c, f, (rope_sp, ctx.rope_q, ctx.rope_k), (ctx.k[i], ctx.v[i]), ctx.mask)
            ks.append(k)
            vs.append(v)
        return torch.stack(ks), torch.stack(vs)

    # --- every frame at once ---

    def forward_sequence(
        self, x: torch.Tensor, prev: torch.Tensor, noise: torch.Tensor, actions: torch.Tensor,
        scene: torch.Tensor, frame_pos: torch.Tensor, noisy: torch.Tensor,
        return_kv: bool = False,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """All N frames of a sequence in one pass with the block-causal mask.

        x, prev (B, N, C, H, W); noise (B, N); actions (B, N, A); scene (B, S);
        frame_pos (N,) the frames' epoch indices; noisy (N,) bool — a noisy frame is a
        generation query: it sees the clean context of its chunk's window and the noisy
        frames of its own chunk, and nothing attends to it (see ``sequence_mask``).
        Returns x0 guesses (B, N, C, H, W) and, if asked, keys/values (L, B, N*T, H, D).
        """
        n, h = x.shape[1], x.shape[3]
        cfg = self.cfg
        t = cfg.tokens_per_frame(h)
        tokens, c = self._embed(x, prev, noise, actions, scene)
        rope_sp = self.rope.spatial_frames(h, n, tokens.dtype)
        is_sink = frame_pos < cfg.sink_frames
        rope_tq = self.rope.time(frame_pos, torch.zeros_like(is_sink), t).to(tokens.dtype)
        rope_tk = self.rope.time(frame_pos, is_sink, t).to(tokens.dtype)
        fmask = sequence_mask(cfg, frame_pos, noisy)  # (N, N)
        mask = fmask.repeat_interleave(t, 0).repeat_interleave(t, 1)[None, None]  # (1,1,NT,NT)
        ks, vs = [], []
        for blk in self.blocks:
            tokens, k, v = blk(tokens, c, n, (rope_sp, rope_tq, rope_tk), None, mask)
            if return_kv:
                ks.append(k)
                vs.append(v)
        out = self._head(tokens, c, prev, actions)
        return out, ((torch.stack(ks), torch.stack(vs)) if return_kv else None)

    @staticmethod
    def decode(x: torch.Tensor) -> torch.Tensor:
        """Clean frames (..., C, H, W) in [-1, 1] -> uint8 (..., H, W, C)."""
        return ((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).movedim(-3, -1)

    @staticmethod
    def encode(frames: torch.Tensor) -> torch.Tensor:
        """uint8 (..., H, W, C) -> floats (..., C, H, W) in [-1, 1] (observations, training)."""
        return frames.movedim(-1, -3).float() / 127.5 - 1.0


def sequence_mask(cfg: ModelConfig, pos: torch.Tensor, noisy: torch.Tensor) -> torch.Tensor:
    """Frame-level attention mask (N, N), True = query frame i may attend key frame j.

    A clean key j is visible to query i when it is in i's chunk (clean queries only), or is
    committed before i's chunk and is a sink frame or inside the window of the last
    ``window_frames`` frames before the chunk. A noisy key is visible only to the noisy
    frames of its own chunk. This is exactly what the KV cache holds at that chunk.
    """
    fc = cfg.frames_per_chunk
    chunk = torch.div(pos, fc, rounding_mode="floor")
    start = chunk * fc
    pj = pos[None, :]
    same_chunk = chunk[:, None] == chunk[None, :]
    before = pj < start[:, None]
    in_cache = before & ((pj < cfg.sink_frames) | (pj >= start[:, None] - cfg.window_frames))
    ni, nj = noisy[:, None], noisy[None, :]
    clean_key = ~nj & (in_cache | (same_chunk & ~ni))
    noisy_key = nj & ni & same_chunk
    return clean_key | noisy_key
