"""The ground tokenizer: a convolutional VQ autoencoder from views of the ground to discrete
codes and back, the decoder conditioned on the scene (issue 38, item 3).

A world canvas holds codes, not pixels: ground that enters the view is sampled as codes, so
unknown ground becomes one plausible ground, never the average of all. One code covers 4x4
pixels of a 64-px view (4x4 world units). The codes are meant to carry the place's geometry
(terrain, roads, roofs, trees, the rain or snow lying there) and the decoder the scene's look:
training (``training/tokenizer.py``) encodes a view under one scene and asks the decoder for
the same place under another of the same biome, vegetation and weather, so a prompt switch
re-skins the same codes.

    frame (B, 3, H, W) in [-1, 1]
      -> Encoder: conv, [res block, stride-2 conv] x 2, res block, 1x1 -> (B, D, H/4, W/4)
      -> VectorQuantizer: nearest of K codes (cosine), straight-through -> ids (B, H/4, W/4)
      -> Decoder(scene): 1x1, [res block (scene FiLM), 2x up + conv] x 2, res block, conv
      -> frame (B, 3, H, W)

Weights ship in half precision (``save_tokenizer``); the model computes in float32.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from worldserve.model.default import WEIGHTS_DIR
from worldserve.world.scene import SCENE_DIM

UPSAMPLING = ("nearest", "bilinear")  # the decoder's choices of 2x step
WEIGHTS = WEIGHTS_DIR / "tokenizer"  # the committed export (no suffix)


@dataclass(frozen=True)
class TokenizerConfig:
    codes: int = 1024  # codebook entries
    code_dim: int = 32  # each code's vector (unit length: codes are compared by cosine)
    widths: tuple[int, int, int] = (32, 64, 96)  # channels at full, half and quarter resolution
    scene_dim: int = SCENE_DIM  # the scene vector the decoder is conditioned on
    groups: int = 8  # group norm groups in every res block
    upsample: str = "nearest"  # the decoder's 2x steps: "nearest" or "bilinear" (no 4-px grid)
    # > 0: the decoder's norms take their statistics over this many pixels around each pixel (``LocalGroupNorm``)
    norm_window: int = 0

    def __post_init__(self) -> None:
        if self.codes < 2 or self.code_dim < 1:
            raise ValueError(f"codes {self.codes} and code_dim {self.code_dim} must be at least 2 and 1")
        if len(self.widths) != 3 or any(w % self.groups for w in self.widths):
            raise ValueError(f"widths {self.widths} must be three multiples of groups={self.groups}")
        if self.upsample not in UPSAMPLING:
            raise ValueError(f"upsample {self.upsample!r} must be one of {UPSAMPLING}")
        if self.norm_window < 0 or self.norm_window % self.down:
            raise ValueError(f"norm_window {self.norm_window} must be 0 or a positive multiple of {self.down}")

    @property
    def down(self) -> int:
        """Pixels per code along each axis."""
        return 2 ** (len(self.widths) - 1)


class LocalGroupNorm(nn.GroupNorm):
    """Group norm whose mean and variance are those of a ``window`` x ``window`` square around
    each pixel (cut at the input's edges), not of the whole input. The same weights as
    ``nn.GroupNorm``.

    The decoder learnt on 32-px crops, so its norms met the statistics of 32 px of ground. Served,
    it decodes a canvas tile with its neighbours' codes around it (88 px), and with whole-input
    statistics every pixel's colour then depends on everything in that crop: the same codes
    decode paler or redder as the prior's tiles around them change, and two tiles decoded apart
    meet with a step. With a window, a pixel depends only on the ground near it."""

    def __init__(self, groups: int, ch: int, window: int):
        super().__init__(groups, ch)
        if window < 1:
            raise ValueError(f"window {window} must be at least one pixel")
        self.window = window | 1  # odd: centred on the pixel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        g, pad = self.num_groups, self.window // 2
        xg = x.float().view(b, g, c // g, h, w)
        moments = torch.cat((xg.mean(2), xg.square().mean(2)), 1)  # (B, 2G, H, W)
        mean, sq = box_mean(moments, pad).chunk(2, 1)
        std = torch.sqrt((sq - mean.square()).clamp_min(0) + self.eps)
        y = ((xg - mean[:, :, None]) / std[:, :, None]).view(b, c, h, w).to(x.dtype)
        return y * self.weight[:, None, None] + self.bias[:, None, None]


def box_mean(x: torch.Tensor, r: int) -> torch.Tensor:
    """The mean of (B, C, H, W) ``x`` over the (2r + 1)² square around each pixel, the square
    cut at the edges: running sums along each axis in turn, so the cost does not grow with r
    (``F.avg_pool2d`` without padding counted is several times slower on CPUs) and each sum
    runs over one row or column, not the whole input (no far-away rounding)."""
    k = 2 * r + 1
    for dim in (-1, -2):
        n = x.shape[dim]
        cs = F.pad(x, (r + 1, r) if dim == -1 else (0, 0, r + 1, r)).cumsum(dim)
        sums = cs.narrow(dim, k, n) - cs.narrow(dim, 0, n)
        i = torch.arange(n, device=x.device)
        count = ((i + r + 1).clamp(max=n) - (i - r).clamp(min=0)).to(x.dtype)
        x = sums / (count if dim == -1 else count[:, None])
    return x


def group_norm(groups: int, ch: int, window: int = 0) -> nn.GroupNorm:
    """``nn.GroupNorm``, or with ``window`` > 0 its local form (``LocalGroupNorm``)."""
    return LocalGroupNorm(groups, ch, window) if window else nn.GroupNorm(groups, ch)


class ResBlock(nn.Module):
    """Two 3x3 convolutions around a skip; with ``scene_dim``, each norm's output is scaled and
    shifted per channel from the scene (FiLM), starting at identity. ``window``: the norms'
    (``group_norm``)."""

    def __init__(self, ch: int, groups: int, scene_dim: int = 0, window: int = 0):
        super().__init__()
        self.norm1, self.norm2 = group_norm(groups, ch, window), group_norm(groups, ch, window)
        self.conv1, self.conv2 = nn.Conv2d(ch, ch, 3, padding=1), nn.Conv2d(ch, ch, 3, padding=1)
        self.film = nn.Linear(scene_dim, 4 * ch) if scene_dim else None
        if self.film is not None:
            nn.init.zeros_(self.film.weight)
            nn.init.zeros_(self.film.bias)

    def forward(self, x: torch.Tensor, scene: torch.Tensor | None = None) -> torch.Tensor:
        if self.film is None or scene is None:
            h = self.conv1(F.silu(self.norm1(x)))
            return x + self.conv2(F.silu(self.norm2(h)))
        s1, b1, s2, b2 = self.film(scene)[:, :, None, None].chunk(4, 1)  # each (B, C, 1, 1)
        h = self.conv1(F.silu(self.norm1(x) * (1 + s1) + b1))
        return x + self.conv2(F.silu(self.norm2(h) * (1 + s2) + b2))


class Encoder(nn.Module):
    def __init__(self, cfg: TokenizerConfig):
        super().__init__()
        w0, w1, w2 = cfg.widths
        self.stem = nn.Conv2d(3, w0, 3, padding=1)
        self.res0, self.down0 = ResBlock(w0, cfg.groups), nn.Conv2d(w0, w1, 4, stride=2, padding=1)
        self.res1, self.down1 = ResBlock(w1, cfg.groups), nn.Conv2d(w1, w2, 4, stride=2, padding=1)
        self.res2 = ResBlock(w2, cfg.groups)
        self.out = nn.Conv2d(w2, cfg.code_dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (B, D, H/4, W/4)."""
        h = self.down0(self.res0(self.stem(x)))  # (B, w1, H/2, W/2)
        h = self.down1(self.res1(h))  # (B, w2, H/4, W/4)
        return self.out(F.silu(self.res2(h)))


class Decoder(nn.Module):
    def __init__(self, cfg: TokenizerConfig):
        super().__init__()
        w0, w1, w2 = cfg.widths
        win = cfg.norm_window  # full-resolution pixels; halved at each coarser level
        self.inp = nn.Conv2d(cfg.code_dim, w2, 1)
        self.res2 = ResBlock(w2, cfg.groups, cfg.scene_dim, win // 4)
        self.up1 = nn.Conv2d(w2, w1, 3, padding=1)
        self.res1 = ResBlock(w1, cfg.groups, cfg.scene_dim, win // 2)
        self.up0 = nn.Conv2d(w1, w0, 3, padding=1)
        self.res0 = ResBlock(w0, cfg.groups, cfg.scene_dim, win)
        self.norm, self.out = group_norm(cfg.groups, w0, win), nn.Conv2d(w0, 3, 3, padding=1)
        self.mode = cfg.upsample

    def forward(self, z: torch.Tensor, scene: torch.Tensor) -> torch.Tensor:
        """(B, D, h, w) code vectors and (B, scene_dim) scenes -> (B, 3, 4h, 4w) in about [-1, 1]."""
        h = self.res2(self.inp(z), scene)
        h = self.res1(self.up1(self.up(h)), scene)  # (B, w1, 2h, 2w)
        h = self.res0(self.up0(self.up(h)), scene)  # (B, w0, 4h, 4w)
        return self.out(F.silu(self.norm(h)))

    def up(self, h: torch.Tensor) -> torch.Tensor:
        """2x, by ``TokenizerConfig.upsample``."""
        return F.interpolate(h, scale_factor=2, mode=self.mode, align_corners=None if self.mode == "nearest" else False)


class VectorQuantizer(nn.Module):
    """Nearest code by cosine similarity; the codebook learns by its own loss term."""

    def __init__(self, cfg: TokenizerConfig):
        super().__init__()
        self.codebook = nn.Parameter(torch.randn(cfg.codes, cfg.code_dim))

    def table(self) -> torch.Tensor:
        return F.normalize(self.codebook, dim=-1)  # (K, D)

    def ids(self, z: torch.Tensor) -> torch.Tensor:
        """(B, D, h, w) encoder output -> (B, h, w) code ids."""
        flat = F.normalize(z, dim=1).permute(0, 2, 3, 1)  # (B, h, w, D)
        return (flat @ self.table().T).argmax(-1)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, h, w) ids -> (B, D, h, w) code vectors."""
        return F.embedding(ids, self.table()).permute(0, 3, 1, 2)

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(quantized with a straight-through gradient, ids, the codebook + commitment loss)."""
        zn = F.normalize(z, dim=1)
        ids = self.ids(z)
        q = self.lookup(ids)
        loss = F.mse_loss(q, zn.detach()) + 0.25 * F.mse_loss(zn, q.detach())
        return zn + (q - zn).detach(), ids, loss


class GroundTokenizer(nn.Module):
    def __init__(self, cfg: TokenizerConfig | None = None):
        super().__init__()
        self.cfg = cfg or TokenizerConfig()
        self.encoder = Encoder(self.cfg)
        self.quantizer = VectorQuantizer(self.cfg)
        self.decoder = Decoder(self.cfg)

    def encode(self, frames: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1] -> (B, H/4, W/4) code ids."""
        return self.quantizer.ids(self.encoder(frames))

    def decode(self, ids: torch.Tensor, scene: torch.Tensor) -> torch.Tensor:
        """(B, h, w) ids, (B, scene_dim) scenes -> (B, 3, 4h, 4w) frames in about [-1, 1]."""
        return self.decoder(self.quantizer.lookup(ids), scene)

    def forward(self, frames: torch.Tensor, scene: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Training's pass: (reconstruction under ``scene``, ids, quantizer loss)."""
        q, ids, vq_loss = self.quantizer(self.encoder(frames))
        return self.decoder(q, scene), ids, vq_loss


def save_tokenizer(model: GroundTokenizer, dest: Path, report: dict | None = None) -> Path:
    """``dest``.safetensors (half precision) and ``dest``.json (the config, and ``report``)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    path = dest.with_suffix(".safetensors")
    save_file(tensors, str(path))
    meta = {"config": asdict(model.cfg)} | ({"report": report} if report else {})
    dest.with_suffix(".json").write_text(json.dumps(meta, indent=2))
    return path


def load_tokenizer(dest: Path) -> GroundTokenizer:
    """The tokenizer ``save_tokenizer`` wrote at ``dest`` (no suffix), in float32."""
    meta = json.loads(dest.with_suffix(".json").read_text())
    cfg = meta["config"]
    model = GroundTokenizer(TokenizerConfig(**{**cfg, "widths": tuple(cfg["widths"])}))
    state = {k: v.float() for k, v in load_file(str(dest.with_suffix(".safetensors"))).items()}
    model.load_state_dict(state)
    return model.eval()
