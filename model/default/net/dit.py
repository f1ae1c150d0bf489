"""The causal few-step world model, top to bottom: conditioning, attention, MLP, block, model.

Pixel space, no VAE. A frame of ``bucket``² pixels is cut into (bucket/patch)² tokens. Each
token sees its patch of the noisy frame *and* of the previous clean frame (the stem), plus the
frame's action and scene vectors. Conditioning (noise level + action + scene) also reaches
every block through adaLN. Attention is block-causal with 2-D RoPE in space and a relative
time rotation (``model/default/net/rope.py``): a chunk sees itself, the sink frames and the window.

The head predicts the clean frame as a per-token motion kernel applied to the previous frame
(separable, ±radius pixels in y and x: the shift the action causes) plus a residual for what
the shift cannot explain (new terrain at the edges, things that move on their own).

Explicit steps, no whole-video API:
- ``prepare_chunk``: what every step of one chunk shares, computed once (the previous frame's
  half of the stem, the action and scene tokens, every block's adaLN modulation for each
  noise level of the chunk, the action's motion prior);
- ``denoise_step``: one denoising forward of a prepared chunk against its cached context ->
  x0 guess; ``commit_step``: the clean chunk at noise 0 -> per-layer keys/values for the
  cache; ``denoise_chunk`` / ``commit_chunk`` prepare and run one step in one call;
- ``forward_sequence``: every frame of a sequence in one pass with the block-causal mask
  (training, re-caching after a scene/bucket change or a restore, and the equality tests);
- ``decode``: clean frames in [-1, 1] -> uint8 pixels (the whole "decoder": a clamp).

Frames are (B, F, C, H, W) floats in [-1, 1]; "no previous frame" is all zeros. A ``prev``
input has ``cfg.prev_channels``: the previous frame, then the anchor
reference (``model/default/reference/anchor.py``) that the head may copy from, pixel by pixel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from worldserve.model.attention import attend
from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.net.flow import level_tensor, next_noisy
from worldserve.model.default.net.rope import Rope, RopeTables
from worldserve.model.default.net.state_draw import StateBasis, lay_state, state_kinds
from worldserve.model.default.net.warp import shift_warp


@dataclass(slots=True)
class ChunkContext:
    """What a chunk attends to, built once per chunk by the KV cache.

    ``k`` / ``v`` hold the cached keys/values in their first Nc tokens and leave the last Tq
    for the chunk's own: every forward writes its keys there in place and attends over the
    whole buffer, so no step concatenates. Inference only (no autograd through it).
    """

    k: torch.Tensor  # (L, B, Nc + Tq, H, D) cached keys rotated in space and time, own tail
    v: torch.Tensor  # (L, B, Nc + Tq, H, D)
    mask: torch.Tensor | None  # (B, 1, 1, Nc + Tq) bool, True = attend; None = all valid
    rope_q: Rope  # time rotation of the chunk's queries, (Tq, D)
    rope_k: Rope  # time rotation of the chunk's own keys, (B, Tq, D): sink frames zeroed


Modulation = tuple[torch.Tensor, ...]  # a block's adaLN shift/scale/gate x2, each (B, F, W)


@dataclass(slots=True)
class ChunkInputs:
    """What every forward of one chunk shares (``WorldModel.prepare_chunk``)."""

    prev: torch.Tensor  # (B, F, C, H, W) the previous clean frame
    actions: torch.Tensor  # (B, F, A)
    base: torch.Tensor  # (B, F*T, W) stem(prev half) + bias + action and scene tokens
    levels: tuple[float, ...]  # the noise levels prepared, in order
    mods: list[list[Modulation]]  # [level][block] adaLN modulations
    final: list[tuple[torch.Tensor, torch.Tensor]]  # [level] head shift, scale
    prior: torch.Tensor  # (B*F, 1, 1, 2, taps) the action's motion-kernel logits
    state: torch.Tensor | None = None  # (B*F, K, H, W) the live state's channels and shapes (``_state_channels``)


# ---------------------------------------------------------------------------- conditioning


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, frames: int) -> torch.Tensor:
    """adaLN: x (B, F*T, W) * (1 + scale) + shift, per-frame shift/scale (B, F, W)."""
    b, n, w = x.shape
    x = torch.addcmul(shift[:, :, None], x.view(b, frames, n // frames, w), 1 + scale[:, :, None])
    return x.view(b, n, w)


def trusted_mix(
    logit: torch.Tensor, mask: torch.Tensor, resid: torch.Tensor, trust: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's reference mix with ``trust`` logits added, and its residual (B, F, C, H, W)
    shrunk by the share of each pixel that the added trust takes from it: where the head
    now copies the reference whole, it adds nothing of its own on top. ``logit`` (B*F, 1,
    H, W) is the head's mix logit, ``mask`` the reference's coverage. Serving only: the
    weights learnt with no trust; a world canvas is a whole, written reference, which the
    compositor trained on the anchor's partial one distrusts (``ModelConfig.reference_trust``)."""
    own = logit.sigmoid() * mask
    mix = (logit + trust).sigmoid() * mask
    keep = (1 - mix) / (1 - own).clamp_min(1e-6)  # 1 at no trust, 0 where the reference is copied whole
    b, f = resid.shape[:2]
    return mix, resid * keep.view(b, f, *keep.shape[1:]).to(resid.dtype)


def gated_residual(x: torch.Tensor, h: torch.Tensor, gate: torch.Tensor, frames: int) -> torch.Tensor:
    """x + gate * h, per-frame gate (B, F, W)."""
    b, n, w = x.shape
    out = torch.addcmul(x.view(b, frames, n // frames, w), h.view(b, frames, n // frames, w), gate[:, :, None])
    return out.view(b, n, w)


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
        qkv = self.qkv(x).view(b, n, 3, self.heads, self.head_dim)
        # q and k normalized and rotated together: half the small ops of doing them apart
        w = torch.stack((self.q_norm.weight, self.k_norm.weight))[:, None]  # (2, 1, D)
        qk = F.rms_norm(qkv[:, :, :2], (self.head_dim,), eps=self.q_norm.eps) * w
        q, k = rope_sp.apply(qk, extra_dims=1).unbind(2)
        return q, k, qkv[:, :, 2]

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
        if ctx_kv is not None:  # the context buffer's tail is this chunk's own
            k_all, v_all = ctx_kv
            k_all[:, -n:] = k
            v_all[:, -n:] = v
        else:
            k_all, v_all = k, v
        o = attend(q, k_all, v_all, mask)  # (B, T, H, D)
        return self.proj(o.reshape(b, n, w)), k_store, v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = int(cfg.mlp_ratio * cfg.width)
        self.fc1 = nn.Linear(cfg.width, hidden)
        self.fc2 = nn.Linear(hidden, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


# ---------------------------------------------------------------------------- block


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.width, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.width, elementwise_affine=False, eps=1e-6)
        self.mlp = MLP(cfg)
        self.ada = nn.Linear(cfg.width, 6 * cfg.width)  # adaLN-Zero: shift/scale/gate x2

    def modulation(self, c: torch.Tensor) -> Modulation:
        """c (..., F, W) -> shift/scale/gate for attention and MLP, each (..., F, W)."""
        return tuple(self.ada(c).chunk(6, -1))

    def forward(
        self,
        x: torch.Tensor,
        mod: Modulation,
        frames: int,
        ropes: tuple[Rope, Rope, Rope],
        ctx_kv: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, F*T, W), ``modulation(c)`` -> x, k_store, v."""
        sh1, sc1, g1, sh2, sc2, g2 = mod
        h, k, v = self.attn(modulate(self.norm1(x), sh1, sc1, frames), *ropes, ctx_kv, mask)
        x = gated_residual(x, h, g1, frames)
        x = gated_residual(x, self.mlp(modulate(self.norm2(x), sh2, sc2, frames)), g2, frames)
        return x, k, v

    def keys_values_only(
        self, x: torch.Tensor, mod: Modulation, frames: int, rope_sp: Rope
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The commit pass needs only the last block's keys/values."""
        _, k, v = self.attn.keys_values(modulate(self.norm1(x), mod[0], mod[1], frames), rope_sp)
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


STATE_POOL = 4  # pixels per side averaged into each input of the state's stem
ANCHOR_START = -6.0  # initial anchor mix logit: sigmoid(-6) = 0.25 % of each pixel from the anchor

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
        # the anchor reference's stem, each pixel's mix logit, the shift per action
        self.anchor_stems = nn.ModuleDict({f"b{b}": nn.Linear((c + 1) * p * p, w) for b in cfg.buckets})
        self.anchor_heads = nn.ModuleDict({f"b{b}": nn.Linear(w, p * p) for b in cfg.buckets})
        self.shift_head = nn.Linear(cfg.action_dim, 2)
        # the live state (what moves, ``model/default/reference/live/``): its own stem, and per
        # token a gain and a colour for each state channel, laid on the frame pixel by pixel
        k = cfg.state_channels
        if k:
            pooled = k * (p // STATE_POOL) ** 2  # the state's stem reads it averaged over STATE_POOL² pixels
            self.state_stems = nn.ModuleDict({f"b{b}": nn.Linear(pooled, w, bias=False) for b in cfg.buckets})
            self.state_heads = nn.ModuleDict({f"b{b}": nn.Linear(w, 2 * c * k) for b in cfg.buckets})
        if k and cfg.state_basis:  # learned per-pixel shapes of the actors (``net/state_draw.py``)
            self.state_basis = StateBasis(k, cfg.state_basis)
            kb = state_kinds(k) * cfg.state_basis
            self.state_basis_heads = nn.ModuleDict({f"b{b}": nn.Linear(w, 2 * c * kb) for b in cfg.buckets})
        self.rope = RopeTables(cfg)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        for blk in self.blocks:  # adaLN-Zero: every block starts as the identity
            nn.init.zeros_(blk.ada.weight)
            nn.init.zeros_(blk.ada.bias)
        nn.init.zeros_(self.final_ada.weight)
        nn.init.zeros_(self.final_ada.bias)
        for head in [*self.heads.values(), *self.motion_prior.values()]:
            nn.init.zeros_(head.weight)  # start as "copy the previous frame"
            nn.init.zeros_(head.bias)
        for stem in self.anchor_stems.values():  # starts unseen: the model is what it was
            nn.init.zeros_(stem.weight)
        for head in self.anchor_heads.values():
            nn.init.zeros_(head.weight)
            nn.init.constant_(head.bias, ANCHOR_START)
        nn.init.zeros_(self.shift_head.weight)
        if self.cfg.state_channels:  # the live state starts unseen and undrawn: the model is what it was
            for m in [*self.state_stems.values(), *self.state_heads.values()]:
                nn.init.zeros_(m.weight)
            for head in self.state_heads.values():
                nn.init.zeros_(head.bias)
        if self.cfg.state_channels and self.cfg.state_basis:  # the shapes start undrawn
            for head in self.state_basis_heads.values():
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)

    # --- pieces shared by every path ---

    def _conditioning(self, noise: torch.Tensor, actions: torch.Tensor, scene: torch.Tensor) -> torch.Tensor:
        """silu(noise + action + scene embeddings) (..., F, W); scene (B, S) or (B, F, S)."""
        if scene.dim() == 2:
            scene = scene[:, None]
        return F.silu(self.noise_embed(noise) + self.action_cond(actions) + self.scene_cond(scene))

    def _frame_tokens(self, actions: torch.Tensor, scene: torch.Tensor) -> torch.Tensor:
        """Action + scene token added to every token of a frame, (B, F, W)."""
        if scene.dim() == 2:
            scene = scene[:, None]
        return self.action_token(actions) + self.scene_token(scene)

    def _embed(
        self, x: torch.Tensor, prev: torch.Tensor, noise: torch.Tensor, actions: torch.Tensor,
        scene: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens (B, F*T, W) and per-frame conditioning (B, F, W).

        x, prev (B, F, C, H, W); noise (B, F); actions (B, F, A); scene (B, S) for the
        whole chunk or (B, F, S) per frame (a prompt change inside a training sequence).
        """
        b, f, c, h, _ = x.shape
        tokens = self.stems[f"b{h}"](patchify(torch.cat((x, prev[:, :, :c]), 2), self.cfg.patch))  # (B, F*T, W)
        tokens = self._with_reference(tokens, prev)
        t = tokens.shape[1] // f
        tokens = (tokens.view(b, f, t, -1) + self._frame_tokens(actions, scene)[:, :, None]).view(b, f * t, -1)
        return tokens, self._conditioning(noise, actions, scene)

    def _with_reference(self, tokens: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """Stem tokens (B, F*T, W) plus the reference's own stem over the reference channels
        of ``prev`` (B, F, prev_channels, H, W), and the live state's over its channels."""
        cfg, h = self.cfg, prev.shape[-1]
        c, r = cfg.channels, cfg.reference_channels
        tokens = tokens + self.anchor_stems[f"b{h}"](patchify(prev[:, :, c:r], cfg.patch))
        if cfg.state_channels:
            b, f = prev.shape[:2]
            st = F.avg_pool2d(prev[:, :, r:].flatten(0, 1), STATE_POOL)
            st = st.view(b, f, cfg.state_channels, h // STATE_POOL, h // STATE_POOL)
            tokens = tokens + self.state_stems[f"b{h}"](patchify(st, cfg.patch // STATE_POOL))
        return tokens

    def _state_channels(self, prev: torch.Tensor) -> torch.Tensor:
        """The live state's channels of ``prev`` (B, F, prev_channels, H, W) as the drawing reads
        them, (B*F, K, H, W) float: the raw channels, then the learned shapes (``state_basis``).
        They are the same at every denoising step of a chunk: ``prepare_chunk`` makes them once."""
        st = prev[:, :, self.cfg.reference_channels :].float().flatten(0, 1)
        return torch.cat((st, self.state_basis(st).float()), 1) if self.cfg.state_basis else st

    def _draw_state(self, frame: torch.Tensor, normed: torch.Tensor, st: torch.Tensor) -> torch.Tensor:
        """The frame (B, F, C, H, W) with the live state laid on it (``net/state_draw.py``):
        per token a gain and a colour for each of the state's channels ``st``
        (``_state_channels``). What things look like is the weights'."""
        cfg = self.cfg
        b, f, ch, h, _ = frame.shape
        g = h // cfg.patch
        coef = self.state_heads[f"b{h}"](normed).float().view(b * f, g, g, 2, ch, -1)
        if cfg.state_basis:
            extra = self.state_basis_heads[f"b{h}"](normed).float().view(b * f, g, g, 2, ch, -1)
            coef = torch.cat((coef, extra), -1)
        return lay_state(frame, coef, st, cfg.patch)

    def camera_shift(self, actions: torch.Tensor, bucket: int) -> torch.Tensor:
        """The static scene's shift (dy, dx) in pixels at ``bucket`` under ``actions`` (..., A),
        as the model estimates it: learned at the base bucket, scaled."""
        w = self.shift_head.weight
        return self.shift_head(actions.to(w.dtype)).float() * (bucket / self.cfg.base_bucket)

    def _prior(self, actions: torch.Tensor, h: int) -> torch.Tensor:
        b, f = actions.shape[:2]
        return self.motion_prior[f"b{h}"](actions).reshape(b * f, 1, 1, 2, -1)

    def _head(
        self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, prev: torch.Tensor,
        prior: torch.Tensor, kernels: list[torch.Tensor] | None = None, state: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final tokens -> clean-frame guess (B, F, C, H, W). ``kernels``, if given, receives
        the motion kernels (B*F, gh, gw, 2, taps), y then x, softmax over the offsets."""
        cfg, p = self.cfg, self.cfg.patch
        ch = cfg.channels
        b, f, _, h, w = prev.shape
        g, r = h // p, cfg.radius(h)
        normed = modulate(self.final_norm(x), shift, scale, f)
        out = self.heads[f"b{h}"](normed)  # (B, F*T, O)
        resid = unpatchify(out[..., : ch * p * p], f, ch, p, g)
        taps = 2 * r + 1
        logits = out[..., ch * p * p :].reshape(b * f, g, g, 2, taps)
        kern = (logits + prior).float().softmax(-1)
        if kernels is not None:
            kernels.append(kern)
        flat_prev = prev[:, :, :ch].reshape(b * f, ch, h, w).float()
        moved = shift_warp(flat_prev, kern[..., 0, :], kern[..., 1, :], r, p)
        # copy from the anchor where the head trusts it and it shows anything
        ref = prev[:, :, ch : cfg.reference_channels].reshape(b * f, ch + 1, h, w).float()
        logit = unpatchify(self.anchor_heads[f"b{h}"](normed), f, 1, p, g).reshape(b * f, 1, h, w).float()
        mix = logit.sigmoid() * ref[:, ch:]
        if cfg.reference_trust:
            mix, resid = trusted_mix(logit, ref[:, ch:], resid, cfg.reference_trust)
        moved = torch.lerp(moved, ref[:, :ch], mix)
        frame = moved.view(b, f, ch, h, w).to(resid.dtype) + resid
        if not cfg.state_channels:
            return frame
        return self._draw_state(frame, normed, state if state is not None else self._state_channels(prev))

    # --- cached, chunk-by-chunk steps ---

    def prepare_chunk(
        self, prev: torch.Tensor, actions: torch.Tensor, scene: torch.Tensor,
        levels: tuple[float, ...] | list[float],
    ) -> ChunkInputs:
        """Everything the forwards of one chunk share. prev (B, F, C, H, W); actions
        (B, F, A); scene (B, S); ``levels`` the noise levels the chunk will run at (0.0 for
        the commit pass). The stem is linear, so its previous-frame half is computed once."""
        b, f, _, h, _ = prev.shape
        c, p = self.cfg.channels, self.cfg.patch
        if scene.dim() == 2:
            scene = scene[:, None]
        stem = self.stems[f"b{h}"]
        cpp = c * p * p
        base = self._with_reference(F.linear(patchify(prev[:, :, :c], p), stem.weight[:, cpp:], stem.bias), prev)
        t = base.shape[1] // f
        base = (base.view(b, f, t, -1) + self._frame_tokens(actions, scene)[:, :, None]).view(b, f * t, -1)
        levels = tuple(float(v) for v in levels)
        noise = level_tensor(levels, prev.device)[:, None, None].expand(len(levels), b, f)
        cond = self._conditioning(noise, actions[None], scene[None])  # (S, B, F, W)
        per_block = [blk.modulation(cond) for blk in self.blocks]  # [block][6] (S, B, F, W)
        mods = [[tuple(m[i] for m in blk) for blk in per_block] for i in range(len(levels))]
        shift, scale = self.final_ada(cond).chunk(2, -1)
        return ChunkInputs(
            prev=prev, actions=actions, base=base, levels=levels, mods=mods,
            final=[(shift[i], scale[i]) for i in range(len(levels))], prior=self._prior(actions, h),
            state=self._state_channels(prev) if self.cfg.state_channels else None,
        )

    def _tokens(self, x: torch.Tensor, inp: ChunkInputs) -> torch.Tensor:
        c, p = x.shape[2], self.cfg.patch
        stem = self.stems[f"b{x.shape[3]}"]
        return torch.addmm(
            inp.base.reshape(-1, inp.base.shape[-1]), patchify(x, p).flatten(0, 1), stem.weight[:, : c * p * p].t()
        ).view_as(inp.base)

    def denoise_step(self, x: torch.Tensor, inp: ChunkInputs, level: int, ctx: ChunkContext) -> torch.Tensor:
        """One denoising forward: noisy chunk (B, F, C, H, W) at ``inp.levels[level]`` -> x0 guess."""
        f = x.shape[1]
        tokens = self._tokens(x, inp)
        rope_sp = self.rope.spatial_frames(x.shape[-1], f, tokens.dtype, tokens.device)
        for i, blk in enumerate(self.blocks):
            tokens, _, _ = blk(
                tokens, inp.mods[level][i], f, (rope_sp, ctx.rope_q, ctx.rope_k), (ctx.k[i], ctx.v[i]), ctx.mask
            )
        return self._head(tokens, *inp.final[level], inp.prev, inp.prior, state=inp.state)

    def commit_step(self, x: torch.Tensor, inp: ChunkInputs, ctx: ChunkContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The clean chunk at the commit level, the last of ``inp.levels`` (0.0) -> keys,
        values (L, B, F*T, H, D) for the cache."""
        level = len(inp.levels) - 1
        f = x.shape[1]
        tokens = self._tokens(x, inp)
        rope_sp = self.rope.spatial_frames(x.shape[-1], f, tokens.dtype, tokens.device)
        ks, vs = [], []
        last = len(self.blocks) - 1
        for i, blk in enumerate(self.blocks):
            mod = inp.mods[level][i]
            if i == last:
                k, v = blk.keys_values_only(tokens, mod, f, rope_sp)
            else:
                tokens, k, v = blk(tokens, mod, f, (rope_sp, ctx.rope_q, ctx.rope_k), (ctx.k[i], ctx.v[i]), ctx.mask)
            ks.append(k)
            vs.append(v)
        return torch.stack(ks), torch.stack(vs)

    def sample_chunk(
        self, inp: ChunkInputs, ctx: ChunkContext, noise: Callable[[int], torch.Tensor], dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The few-step sampler and the commit pass of one chunk: ``inp`` prepared for the
        step levels then the commit level 0.0; ``noise(i)`` the noise of step ``i``
        (``next_noisy``), asked for in order. Returns pixels uint8 (B, F, H, W, 3) (what the
        client sees), the clean chunk decoded and re-encoded in ``dtype`` (exactly what the
        model conditions on next), and the chunk's keys, values (L, B, F*T, H, D) for the cache."""
        levels, eta = inp.levels[:-1], self.cfg.sampler_eta
        x = x0 = noise(0)
        for i in range(len(levels)):
            x0 = self.denoise_step(x, inp, i, ctx).clamp(-1, 1)
            if i + 1 < len(levels):
                x = next_noisy(x, x0, levels[i], levels[i + 1], noise(i + 1), eta)
        pixels = self.decode(x0)
        clean = self.encode(pixels).to(dtype)
        k, v = self.commit_step(clean, inp, ctx)
        return pixels, clean, k, v

    def denoise_chunk(
        self, x: torch.Tensor, prev: torch.Tensor, noise_level: float, actions: torch.Tensor,
        scene: torch.Tensor, ctx: ChunkContext,
    ) -> torch.Tensor:
        """One denoising forward at ``noise_level`` in one call (prepare + step)."""
        return self.denoise_step(x, self.prepare_chunk(prev, actions, scene, [noise_level]), 0, ctx)

    def commit_chunk(
        self, x: torch.Tensor, prev: torch.Tensor, actions: torch.Tensor, scene: torch.Tensor, ctx: ChunkContext,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The clean chunk -> keys, values (L, B, F*T, H, D) for the cache."""
        return self.commit_step(x, self.prepare_chunk(prev, actions, scene, [0.0]), ctx)

    # --- every frame at once ---

    def forward_sequence(
        self, x: torch.Tensor, prev: torch.Tensor, noise: torch.Tensor, actions: torch.Tensor,
        scene: torch.Tensor, frame_pos: torch.Tensor, noisy: torch.Tensor,
        return_kv: bool = False, kernels: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """All N frames of a sequence in one pass with the block-causal mask.

        x, prev (B, N, C, H, W); noise (B, N); actions (B, N, A); scene (B, S) or (B, N, S);
        frame_pos (N,) the frames' epoch indices; noisy (N,) bool — a noisy frame is a
        generation query: it sees the clean context of its chunk's window and the noisy
        frames of its own chunk, and nothing attends to it (see ``sequence_mask``).
        Returns x0 guesses (B, N, C, H, W) and, if asked, keys/values (L, B, N*T, H, D);
        ``kernels`` receives the motion kernels (see ``_head``).
        """
        n, h = x.shape[1], x.shape[3]
        cfg = self.cfg
        t = cfg.tokens_per_frame(h)
        tokens, c = self._embed(x, prev, noise, actions, scene)
        dev = tokens.device
        rope_sp = self.rope.spatial_frames(h, n, tokens.dtype, dev)
        mods = [blk.modulation(c) for blk in self.blocks]
        frame_pos, noisy = frame_pos.cpu(), noisy.cpu()  # host-side layout, like the cache's cursors
        is_sink = frame_pos < cfg.sink_frames
        rope_tq = self.rope.time(frame_pos, torch.zeros_like(is_sink), t).to(tokens.dtype, dev)
        rope_tk = self.rope.time(frame_pos, is_sink, t).to(tokens.dtype, dev)
        fmask = sequence_mask(cfg, frame_pos, noisy).to(dev)  # (N, N)
        mask = fmask.repeat_interleave(t, 0).repeat_interleave(t, 1)[None, None]  # (1,1,NT,NT)
        ks, vs = [], []
        for blk, mod in zip(self.blocks, mods, strict=True):
            tokens, k, v = blk(tokens, mod, n, (rope_sp, rope_tq, rope_tk), None, mask)
            if return_kv:
                ks.append(k)
                vs.append(v)
        shift, scale = self.final_ada(c).chunk(2, -1)
        out = self._head(tokens, shift, scale, prev, self._prior(actions, h), kernels)
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
