"""Matrix-Game 2.0's action modules, their caches, and the server's actions in its action spaces.

Matrix-Game 2.0 puts an ``ActionModule`` in the first 15 blocks of its Wan backbone, between
the cross-attention and the MLP (``model/wan/causal.py``'s ``Block``). Two attentions add the
player's input to every token of a chunk::

    mouse     per spatial token, over time: the token's features and the mouse window of its
              frame go through mouse_mlp, then t_qkv; each token attends to its own keys at
              the frames of the window (cached) and of the chunk. proj_mouse back to dim.
    keyboard  every token's query (mouse_attn_q) attends to one key per frame made from the
              keyboard window of that frame (keyboard_embed per pixel frame, then
              keyboard_attn_kv of the window). proj_keyboard back to dim.

The window of latent frame g is the actions of pixel frames 4g - 12 .. 4g - 1 (``windows_size``
latent frames of 4), the first frame's action standing in before frame 0: ``ActionHistory``.

Both attentions are block-causal like the self-attention and see the same frames: the cache's
(no sinks, a window of 3 for the universal model) and the chunk's own. So their caches
(``ActionKVCache``: keyboard keys (L_a, S, P, H, D), mouse keys (L_a, S, P, T, H, D); L_a
action blocks, S slots, P cache positions, T tokens a frame) use the self-attention cache's
positions and host-side cursors (``model/wan/cache.py``) and are written by the same commit
pass: one slot, one set of cursors, three sets of buffers. Keys are stored after their RMS
norm and before RoPE; RoPE turns the first ``mouse_qk_dim_list[0] / 2`` pairs of a head by the
frame's position (base 256) when a chunk reads them, from the positions of the cache.

Submodule names are the authors' keys (``blocks.N.action_model.keyboard_embed.0.weight``, ...).
Their per-head RMS norms (``key_attn_q_norm`` ...) normalise without applying their weight, as
their code does; the weight is kept so their checkpoints load.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from worldserve.model.attention import attend
from worldserve.model.wan.cache import WanChunkContext, WanKVCache, rotate
from worldserve.model.wan.config import ActionConfig, WanConfig
from worldserve.session.plan import KEYS

# ---------------------------------------------------------------------------- the module


class HeadNorm(nn.Module):
    """RMS norm over a head's dims, as the authors' action module computes it: the weight is a
    parameter of their checkpoints that their forward never applies (it stays at 1)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class ActionModule(nn.Module):
    """Keyboard and mouse conditioning of one block; see the module docstring."""

    def __init__(self, a: ActionConfig):
        super().__init__()
        from worldserve.model.wan.causal import LayerNorm

        self.cfg = a
        w = a.window_pixel_frames
        self.heads = a.heads_num
        self.keyboard_embed = nn.Sequential(
            nn.Linear(a.keyboard_dim_in, a.hidden_size), nn.SiLU(), nn.Linear(a.hidden_size, a.hidden_size)
        )
        self.mouse_attn_q = nn.Linear(a.img_hidden_size, a.keyboard_hidden_dim, bias=a.qkv_bias)
        self.keyboard_attn_kv = nn.Linear(a.hidden_size * w, 2 * a.keyboard_hidden_dim, bias=a.qkv_bias)
        self.key_attn_q_norm = HeadNorm(a.keyboard_hidden_dim // a.heads_num) if a.qk_norm else nn.Identity()
        self.key_attn_k_norm = HeadNorm(a.keyboard_hidden_dim // a.heads_num) if a.qk_norm else nn.Identity()
        self.proj_keyboard = nn.Linear(a.keyboard_hidden_dim, a.img_hidden_size, bias=a.qkv_bias)
        if a.enable_mouse:
            c = a.mouse_hidden_dim
            self.mouse_mlp = nn.Sequential(
                nn.Linear(a.mouse_dim_in * w + a.img_hidden_size, c), nn.GELU(approximate="tanh"),
                nn.Linear(c, c), LayerNorm(c, eps=1e-5),
            )
            self.t_qkv = nn.Linear(c, 3 * c, bias=a.qkv_bias)
            self.img_attn_q_norm = HeadNorm(c // a.heads_num) if a.qk_norm else nn.Identity()
            self.img_attn_k_norm = HeadNorm(c // a.heads_num) if a.qk_norm else nn.Identity()
            self.proj_mouse = nn.Linear(c, a.img_hidden_size, bias=a.qkv_bias)

    def forward(self, x: torch.Tensor, frames: int, act: ActionContext, index: int, write: bool) -> torch.Tensor:
        """x (B, F*T, dim) after the block's cross-attention; ``index``: this module's rank among
        the action blocks (its layer in the action caches). Returns x plus both attentions."""
        if self.cfg.enable_mouse:
            x = x + self._mouse(x, frames, act, index, write)
        return x + self._keyboard(x, frames, act, index, write)

    def _mouse(self, x: torch.Tensor, f: int, act: ActionContext, index: int, write: bool) -> torch.Tensor:
        b, n, dim = x.shape
        t, h = n // f, self.heads
        assert act.mouse is not None
        tokens = x.view(b, f, t, dim).transpose(1, 2)  # (B, T, F, dim)
        window = act.mouse.flatten(2).to(x.dtype)[:, None].expand(b, t, f, -1)  # (B, T, F, W*mouse_dim)
        z = self.mouse_mlp(torch.cat((tokens, window), -1))  # (B, T, F, c)
        q, k, v = self.t_qkv(z).view(b * t, f, 3, h, -1).unbind(2)  # (B*T, F, H, D) each
        q, k = self.img_attn_q_norm(q), self.img_attn_k_norm(k)
        k_all, v_all = act.cache.read_mouse(index, act, k, v)  # (B*T, used + F, H, D)
        y = attend(act.rotate_own(q, t), k_all, v_all, act.mask_per(t))  # (B*T, F, H, D)
        if write:
            act.cache.write_mouse(index, act, k, v)
        y = y.view(b, t, f, -1).transpose(1, 2).reshape(b, n, -1)  # (B, F*T, c) frame-major
        return self.proj_mouse(y)

    def _keyboard(self, x: torch.Tensor, f: int, act: ActionContext, index: int, write: bool) -> torch.Tensor:
        b, n, _ = x.shape
        t, h = n // f, self.heads
        keys = self.keyboard_embed(act.keyboard.to(x.dtype))  # (B, F, W, hidden) per pixel frame
        k, v = self.keyboard_attn_kv(keys.flatten(2)).view(b, f, 2, h, -1).unbind(2)  # (B, F, H, D)
        q = self.key_attn_q_norm(self.mouse_attn_q(x).view(b, n, h, -1))  # (B, F*T, H, D)
        k = self.key_attn_k_norm(k)
        k_all, v_all = act.cache.read_keyboard(index, act, k, v)  # (B, used + F, H, D)
        y = attend(act.rotate_tokens(q, t), k_all, v_all, act.mask)  # (B, F*T, H, D)
        if write:
            act.cache.write_keyboard(index, act, k, v)
        return self.proj_keyboard(y.flatten(2))


# ---------------------------------------------------------------------------- caches


@dataclass(slots=True)
class ActionContext:
    """One batch of chunks' action inputs, rotations and masks: built once per chunk by
    ``ActionKVCache.chunk`` beside the self-attention's ``WanChunkContext``."""

    cache: ActionKVCache
    ctx: WanChunkContext
    keyboard: torch.Tensor  # (B, F, W, keyboard_dim_in) each latent frame's window of pixel-frame keys
    mouse: torch.Tensor | None  # (B, F, W, mouse_dim_in), None without a mouse
    own_cos: torch.Tensor  # (B, F, 1, Pa) time rotation of the chunk's frames
    own_sin: torch.Tensor
    cache_cos: torch.Tensor  # (B, U, 1, Pa) of the cached frames (U = used frame positions)
    cache_sin: torch.Tensor
    mask: torch.Tensor | None  # (B, 1, 1, U + F) bool, True = attend; None = all valid

    @property
    def used_frames(self) -> int:
        return self.cache_cos.shape[1]

    def rotate_own(self, x: torch.Tensor, t: int) -> torch.Tensor:
        """x (B*T, F, H, D): every token's own frames."""
        return rotate(x, self.own_cos.repeat_interleave(t, 0), self.own_sin.repeat_interleave(t, 0), 0)

    def rotate_tokens(self, x: torch.Tensor, t: int) -> torch.Tensor:
        """x (B, F*T, H, D), frame-major: each token at its frame's position."""
        return rotate(x, self.own_cos.repeat_interleave(t, 1), self.own_sin.repeat_interleave(t, 1), 0)

    def mask_per(self, t: int) -> torch.Tensor | None:
        return None if self.mask is None else self.mask.repeat_interleave(t, 0)


@dataclass(slots=True)
class ActionKVCache:
    """The action modules' keys and values, beside a ``WanKVCache`` whose slots, positions and
    cursors they share (see the module docstring)::

        keyboard_k, keyboard_v:  (L_a, S, P, H, D)      one key per frame position
        mouse_k, mouse_v:        (L_a, S, P, T, H, D)   one key per frame position and token
    """

    cfg: ActionConfig
    pool: WanKVCache
    keyboard_k: torch.Tensor
    keyboard_v: torch.Tensor
    mouse_k: torch.Tensor | None
    mouse_v: torch.Tensor | None

    @classmethod
    def create(cls, cfg: WanConfig, pool: WanKVCache) -> ActionKVCache:
        a = cfg.action_config
        if a is None:
            raise ValueError("ActionKVCache: the model has no action modules (action_config is None)")
        layers, slots, p = len(a.blocks), pool.capacity, cfg.cache_frames
        dtype, dev = pool.k.dtype, pool.k.device
        kb = (layers, slots, p, a.heads_num, a.keyboard_hidden_dim // a.heads_num)
        ms = (layers, slots, p, pool.tokens_per_frame, a.heads_num, a.mouse_hidden_dim // a.heads_num)
        zeros = lambda shape: torch.zeros(shape, dtype=dtype, device=dev)  # noqa: E731
        return cls(
            cfg=a, pool=pool, keyboard_k=zeros(kb), keyboard_v=zeros(kb),
            mouse_k=zeros(ms) if a.enable_mouse else None, mouse_v=zeros(ms) if a.enable_mouse else None,
        )

    def nbytes(self) -> int:
        parts = (self.keyboard_k, self.keyboard_v, self.mouse_k, self.mouse_v)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    def chunk(self, ctx: WanChunkContext, keyboard: torch.Tensor, mouse: torch.Tensor | None) -> ActionContext:
        """The action context of a chunk: ``keyboard`` (B, F, W, keyboard_dim_in) and ``mouse``
        (B, F, W, mouse_dim_in) windows (``ActionHistory.windows``), rows as ``ctx``'s."""
        a, (b, f) = self.cfg, (ctx.batch, ctx.num_frames)
        if ctx.cache is not self.pool:
            raise ValueError("ActionKVCache.chunk: the chunk context is of another KV cache pool")
        want = (b, f, a.window_pixel_frames)
        if tuple(keyboard.shape) != (*want, a.keyboard_dim_in):
            raise ValueError(f"keyboard windows {tuple(keyboard.shape)}, expected {(*want, a.keyboard_dim_in)}")
        if a.enable_mouse and (mouse is None or tuple(mouse.shape) != (*want, a.mouse_dim_in)):
            got = None if mouse is None else tuple(mouse.shape)
            raise ValueError(f"mouse windows {got}, expected {(*want, a.mouse_dim_in)}")
        dev = self.keyboard_k.device
        own_cos, own_sin = action_rotation(a, ctx.rope_positions, dev)
        cache_cos, cache_sin = action_rotation(a, ctx.cache_positions, dev)
        mask = None
        if not ctx.cache_valid.all():
            full = np.concatenate((ctx.cache_valid, np.ones((b, f), dtype=bool)), 1)
            mask = torch.from_numpy(full).to(dev)[:, None, None, :]
        return ActionContext(
            cache=self, ctx=ctx, keyboard=keyboard.to(dev), mouse=None if mouse is None else mouse.to(dev),
            own_cos=own_cos, own_sin=own_sin, cache_cos=cache_cos, cache_sin=cache_sin, mask=mask,
        )

    def read_keyboard(self, index: int, act: ActionContext, k: torch.Tensor, v: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached keyboard keys (rotated) then the chunk's own k (rotated), v (B, F, H, D)."""
        u, rows = act.used_frames, act.ctx.slot_index
        kc = rotate(self.keyboard_k[index, rows, :u].to(k.dtype), act.cache_cos, act.cache_sin, 0)  # (B, U, H, D)
        ko = rotate(k, act.own_cos, act.own_sin, 0)
        return torch.cat((kc, ko), 1), torch.cat((self.keyboard_v[index, rows, :u].to(v.dtype), v), 1)

    def read_mouse(self, index: int, act: ActionContext, k: torch.Tensor, v: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's cached mouse keys then its own: k, v (B*T, F, H, D) -> (B*T, U + F, H, D)."""
        assert self.mouse_k is not None and self.mouse_v is not None
        u, rows = act.used_frames, act.ctx.slot_index
        t = self.mouse_k.shape[3]

        def per_token(c: torch.Tensor) -> torch.Tensor:  # (B, U, T, H, D) -> (B*T, U, H, D)
            return c.transpose(1, 2).flatten(0, 1)

        kc = per_token(self.mouse_k[index, rows, :u]).to(k.dtype)
        kc = rotate(kc, act.cache_cos.repeat_interleave(t, 0), act.cache_sin.repeat_interleave(t, 0), 0)
        vc = per_token(self.mouse_v[index, rows, :u]).to(v.dtype)
        return torch.cat((kc, act.rotate_own(k, t)), 1), torch.cat((vc, v), 1)

    def write_keyboard(self, index: int, act: ActionContext, k: torch.Tensor, v: torch.Tensor) -> None:
        rows, pos = act.ctx.slot_index[:, None], torch.from_numpy(act.ctx.write_positions).to(k.device)
        self.keyboard_k[index, rows, pos] = k.to(self.keyboard_k.dtype)  # (B, F, H, D)
        self.keyboard_v[index, rows, pos] = v.to(self.keyboard_v.dtype)

    def write_mouse(self, index: int, act: ActionContext, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v (B*T, F, H, D) of the chunk's tokens, stored at the chunk's frame positions."""
        assert self.mouse_k is not None and self.mouse_v is not None
        b = act.ctx.batch
        rows, pos = act.ctx.slot_index[:, None], torch.from_numpy(act.ctx.write_positions).to(k.device)
        per_frame = lambda x: x.unflatten(0, (b, -1)).transpose(1, 2)  # noqa: E731  (B, F, T, H, D)
        self.mouse_k[index, rows, pos] = per_frame(k).to(self.mouse_k.dtype)
        self.mouse_v[index, rows, pos] = per_frame(v).to(self.mouse_v.dtype)


def action_rotation(a: ActionConfig, positions: np.ndarray, device: torch.device | str
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (B, N, 1, Pa) of the action heads' time pairs at integer frame ``positions``
    (B, N): pair i turns by position * rope_theta^(-i / Pa), as the authors' 1-D RoPE over time."""
    pairs = a.time_pairs
    inv = 1.0 / a.rope_theta ** (torch.arange(pairs, dtype=torch.float64) / pairs)
    ang = torch.from_numpy(np.ascontiguousarray(positions)).to(torch.float64)[..., None] * inv  # (B, N, Pa)
    return ang.cos().float()[:, :, None].to(device), ang.sin().float()[:, :, None].to(device)


# ---------------------------------------------------------------------------- actions over time


@dataclass(slots=True)
class ActionHistory:
    """One session's pixel-frame actions in the model's action space since its anchor image
    (model frame 0), kept as far back as a window reaches. Pixel frame 0 is the anchor's;
    latent frame g >= 1 covers pixel frames 4g - 3 .. 4g."""

    cfg: ActionConfig
    keyboard: np.ndarray  # (N, keyboard_dim_in) float32, pixel frames first .. first + N - 1
    mouse: np.ndarray  # (N, mouse_dim_in) float32 (zero columns without a mouse)
    first: int = 0  # pixel frame of row 0

    @classmethod
    def empty(cls, a: ActionConfig) -> ActionHistory:
        return cls(a, np.zeros((0, a.keyboard_dim_in), np.float32), np.zeros((0, max(a.mouse_dim_in, 0)), np.float32))

    @property
    def end(self) -> int:
        """The next pixel frame to be given."""
        return self.first + len(self.keyboard)

    def extend(self, keyboard: np.ndarray, mouse: np.ndarray, keep: int) -> None:
        """Append the actions of the next pixel frames; keep the latest ``keep``."""
        kb = np.concatenate((self.keyboard, keyboard.astype(np.float32)))
        ms = np.concatenate((self.mouse, mouse.astype(np.float32)))
        drop = max(len(kb) - keep, 0)
        self.keyboard, self.mouse, self.first = kb[drop:], ms[drop:], self.first + drop

    def windows(self, start: int, frames: int) -> tuple[np.ndarray, np.ndarray]:
        """Keyboard and mouse windows (F, W, dim) of latent frames start .. start + F - 1: the
        actions of pixel frames 4g - W .. 4g - 1, frame 0's action before frame 0."""
        a = self.cfg
        w, r = a.window_pixel_frames, a.vae_time_compression_ratio
        g = start + np.arange(frames)[:, None]  # (F, 1)
        pixel = np.maximum(r * g - w + np.arange(w)[None, :], 0)  # (F, W)
        lo, hi = int(pixel.min()), int(pixel.max())
        if lo < self.first or hi >= self.end:
            raise ValueError(f"action windows of latent frames {start}..{start + frames - 1} need pixel frames "
                             f"{lo}..{hi}; the history holds {self.first}..{self.end - 1}")
        rows = pixel - self.first
        return self.keyboard[rows], self.mouse[rows]


def pixel_frames_of(start: int, frames: int, ratio: int = 4) -> tuple[int, int]:
    """First pixel frame and count of latent frames start .. start + frames - 1."""
    first = 0 if start == 0 else ratio * start - (ratio - 1)
    end = ratio * (start + frames - 1) + 1
    return first, end - first


# ---------------------------------------------------------------------------- the server's actions

CAMERA_STEP = 0.1  # the authors' camera value per pixel frame (their demos' I/K/J/L keys)


def variant_of(a: ActionConfig) -> str:
    """The authors' variant an action config belongs to, by its keyboard and mouse."""
    for name, (kb, mouse) in {"universal": (4, True), "gta_drive": (2, True), "templerun": (7, False)}.items():
        if a.keyboard_dim_in == kb and a.enable_mouse == mouse:
            return name
    raise ValueError(f"no Matrix-Game variant has {a.keyboard_dim_in} keyboard dims with mouse={a.enable_mouse}")


def map_actions(a: ActionConfig, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The server's per-frame action vectors (N, len(KEYS) + 2): held keys forward, back, left,
    right and the mouse delta (dx right, dy down, each in [-1, 1]), in a variant's action space:
    keyboard (N, keyboard_dim_in) and mouse (N, mouse_dim_in) as (pitch, yaw). See docs/model-families.md.

    universal  keyboard multi-hot (W, S, A, D) = (forward, back, left, right); mouse pitch =
               -dy * 0.1 (up is positive), yaw = dx * 0.1 (right is positive).
    gta_drive  keyboard (W, S) = (forward, back); steering is the yaw: left/right keys are
               -/+ 0.1, plus dx * 0.1, clipped to +-0.1; pitch 0.
    templerun  one-hot of 7 (no-move, jump, slide, turn left, turn right, left side, right side):
               a mouse swipe (|dx| >= 0.5) turns, else the first held of forward (jump), back
               (slide), left (left side), right (right side), else no-move; no mouse.
    """
    actions = np.asarray(actions, np.float32)
    if actions.ndim != 2 or actions.shape[1] != len(KEYS) + 2:
        raise ValueError(f"actions {actions.shape}, expected (N, {len(KEYS) + 2})")
    fwd, back, left, right = (actions[:, i] > 0.5 for i in range(len(KEYS)))
    dx, dy = actions[:, len(KEYS)], actions[:, len(KEYS) + 1]
    n = len(actions)
    variant = variant_of(a)
    mouse = np.zeros((n, max(a.mouse_dim_in, 0)), np.float32)
    if variant == "universal":
        keyboard = np.stack((fwd, back, left, right), 1).astype(np.float32)
        mouse[:, 0], mouse[:, 1] = -dy * CAMERA_STEP, dx * CAMERA_STEP
    elif variant == "gta_drive":
        keyboard = np.stack((fwd, back), 1).astype(np.float32)
        steer = CAMERA_STEP * (right.astype(np.float32) - left.astype(np.float32) + dx)
        mouse[:, 1] = np.clip(steer, -CAMERA_STEP, CAMERA_STEP)
    else:  # templerun
        choice = np.zeros(n, np.int64)  # no-move
        for index, held in ((6, right), (5, left), (2, back), (1, fwd)):  # the first held wins
            choice[held] = index
        choice[dx <= -0.5], choice[dx >= 0.5] = 3, 4
        keyboard = np.eye(7, dtype=np.float32)[choice]
    return keyboard, mouse
