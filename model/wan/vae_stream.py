"""The Wan2.1 VAE decoding chunk by chunk, one feature cache per session.

Wan2.1's VAE compresses 4x in time and 8x in space. Its decoder is causal in time: every 3-tap
temporal convolution reads the last two frames of its input from the previous call, so a video
decodes one latent frame at a time, and the first latent frame decodes to 1 pixel frame, every
later one to 4::

    latent frames   | 0 | 1 2 | 3 4 5 | 6 7 8 | ...     chunks of 3: 9 pixel frames first,
    pixel frames    | 1 | 4 4 | 4 4 4 | 4 4 4 | ...     then 12 a chunk

diffusers' ``AutoencoderKLWan`` keeps that cache on the module (``_feat_map``), which suits one
video at a time. A server decodes many sessions with one model, so the cache lives here, in a
``VaeStream`` per session, and goes straight into ``vae.decoder(x, feat_cache=...)``: the module
holds no per-session state and nothing is swapped.

Feature cache of one stream: one entry per causal convolution of the decoder (33 for Wan2.1),
each ``None`` (before the first frame), ``"Rep"`` (a temporal upsampler that has seen only the
first frame) or a tensor (B, C_i, <=2, h_i, w_i) holding the last two input frames of that layer.
After two latent frames every entry is a tensor with two frames, so streams that have decoded the
same number of frames (counted up to two) hold caches of the same shapes: ``decode_batch`` stacks
them on the batch axis, runs them as one forward and gives each stream its own copy of its rows
back. Every layer of the decoder works per sample
(convolutions, RMS norm over channels, attention within one frame), so batching changes nothing
but speed.

Latents in and out are normalised as the transformer sees them: ``z = (mu - mean) / std`` with
the VAE config's ``latents_mean`` / ``latents_std``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import AutoencoderKLWan
from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

# The Wan2.1 VAE as its authors ship it (Wan2.1_VAE.pth): the diffusers config of that file.
WAN21_VAE_CONFIG: dict = {
    "base_dim": 96,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
    "latents_mean": [
        -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
        0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
    ],
    "latents_std": [
        2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
        3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
    ],
}

VAE_CONFIG_FILE = "config.json"
VAE_WEIGHTS_FILE = "diffusion_pytorch_model.safetensors"

CacheEntry = torch.Tensor | str | None


@dataclass(slots=True)
class VaeStream:
    """One session's decoder state: the feature cache and how far the session has decoded.

    ``latent_frames`` / ``pixel_frames`` count what this stream has decoded since ``open``;
    ``latent_hw`` is fixed by the first chunk (a later chunk of another size is an error).
    """

    feat_cache: list[CacheEntry]
    latent_frames: int = 0
    pixel_frames: int = 0
    latent_hw: tuple[int, int] | None = None
    disposed: bool = False

    @property
    def phase(self) -> int:
        """0 fresh, 1 after one latent frame, 2 steady: streams of one phase batch together."""
        return min(self.latent_frames, 2)

    @property
    def cache_bytes(self) -> int:
        """Bytes the feature cache holds now (its steady size after two latent frames)."""
        return sum(e.numel() * e.element_size() for e in self.feat_cache if isinstance(e, torch.Tensor))

    def dispose(self) -> None:
        """Drop the cached features; the stream cannot decode again."""
        self.feat_cache.clear()
        self.disposed = True


def pixel_frames_for(latent_frames_before: int, latent_frames: int) -> int:
    """Pixel frames that ``latent_frames`` more latent frames decode to, after ``latent_frames_before``."""
    if latent_frames_before < 0 or latent_frames < 0:
        raise ValueError(f"frame counts must be >= 0, got before={latent_frames_before}, n={latent_frames}")
    first = 1 if latent_frames_before == 0 and latent_frames > 0 else 0
    return first + 4 * (latent_frames - first)


def load_vae(
    path: str | Path, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
    config: dict | None = None,
) -> AutoencoderKLWan:
    """Load the Wan2.1 VAE from local files only.

    ``path`` is either a diffusers directory (``config.json`` + ``diffusion_pytorch_model.safetensors``,
    e.g. the ``vae/`` folder of Wan2.1-T2V-1.3B-Diffusers) or the authors' ``Wan2.1_VAE.pth``
    (original key names, read with ``weights_only=True`` and renamed by diffusers' table; built with
    ``config``, default ``WAN21_VAE_CONFIG``). A missing file raises ``FileNotFoundError`` naming it.
    """
    path = Path(path)
    if path.is_dir():
        for name in (VAE_CONFIG_FILE, VAE_WEIGHTS_FILE):
            if not (path / name).is_file():
                raise FileNotFoundError(
                    f"VAE directory {path} has no {name} (expected a diffusers AutoencoderKLWan folder)")
        vae = AutoencoderKLWan.from_pretrained(path, local_files_only=True, torch_dtype=dtype)
    elif path.suffix in (".pth", ".pt"):
        if not path.is_file():
            raise FileNotFoundError(f"VAE checkpoint {path} does not exist")
        from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

        state = torch.load(path, map_location="cpu", weights_only=True)
        vae = AutoencoderKLWan(**(config or WAN21_VAE_CONFIG))
        missing, unexpected = vae.load_state_dict(convert_wan_vae_to_diffusers(state), strict=False)
        if missing or unexpected:
            raise ValueError(
                f"VAE checkpoint {path} does not match the Wan2.1 VAE: "
                f"missing keys {sorted(missing)[:5]}, unexpected keys {sorted(unexpected)[:5]}"
            )
        if dtype != torch.float32:
            vae = vae.to(dtype)
    else:
        raise FileNotFoundError(f"VAE path {path} is neither a diffusers directory nor a .pth file")
    return vae.to(device).eval().requires_grad_(False)


class StreamingDecoder:
    """Owns one ``AutoencoderKLWan``; decodes any number of sessions' streams chunk by chunk.

    ``open()`` a ``VaeStream`` per session, ``decode(stream, latents)`` each chunk in order,
    ``stream.dispose()`` (or ``decoder.dispose(stream)``) when the session ends. The decoder runs
    on the executor thread that owns the model; it is not thread-safe.
    """

    def __init__(self, vae: AutoencoderKLWan) -> None:
        cfg = vae.config
        if cfg.is_residual or cfg.patch_size is not None:
            raise ValueError(
                f"StreamingDecoder serves the Wan2.1 VAE; got is_residual={cfg.is_residual}, "
                f"patch_size={cfg.patch_size} (Wan2.2's VAE)"
            )
        for name in ("latents_mean", "latents_std"):
            if len(cfg[name]) != cfg.z_dim:
                raise ValueError(f"VAE config {name} has {len(cfg[name])} values, expected z_dim={cfg.z_dim}")
        self.vae = vae
        self.z_dim: int = cfg.z_dim
        self.n_convs: int = sum(1 for _ in self._causal_convs())
        p = next(vae.parameters())
        shape = (1, cfg.z_dim, 1, 1, 1)
        self.mean = torch.tensor(cfg.latents_mean, dtype=torch.float32, device=p.device).view(shape)
        self.std = torch.tensor(cfg.latents_std, dtype=torch.float32, device=p.device).view(shape)

    @classmethod
    def load(
        cls, path: str | Path, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
        config: dict | None = None,
    ) -> StreamingDecoder:
        """``load_vae`` (a diffusers directory or the authors' ``.pth``) wrapped in a decoder."""
        return cls(load_vae(path, device=device, dtype=dtype, config=config))

    @property
    def device(self) -> torch.device:
        return next(self.vae.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.vae.parameters()).dtype

    def _causal_convs(self):
        return (m for m in self.vae.decoder.modules() if isinstance(m, WanCausalConv3d))

    # -- sessions ---------------------------------------------------------------------------

    def open(self) -> VaeStream:
        """A fresh stream: the next latent frame it decodes is a video's first."""
        return VaeStream(feat_cache=[None] * self.n_convs)

    def dispose(self, stream: VaeStream) -> None:
        stream.dispose()

    # -- decoding ---------------------------------------------------------------------------

    @torch.inference_mode()
    def decode(self, stream: VaeStream, latents: torch.Tensor) -> torch.Tensor:
        """Decode one chunk of normalised latents (C, F, h, w) or (1, C, F, h, w).

        Returns uint8 frames (F', 8h, 8w, 3) on the VAE's device, F' = ``pixel_frames_for``
        (9 for a first chunk of 3, then 12). The tensor is not copied to the host, so the caller
        decides when to wait for it.
        """
        if latents.dim() == 4:
            latents = latents.unsqueeze(0)
        if latents.dim() != 5 or latents.shape[0] != 1:
            raise ValueError(f"decode takes latents (C, F, h, w) or (1, C, F, h, w), got {tuple(latents.shape)}")
        return self.decode_batch([stream], latents)[0]

    @torch.inference_mode()
    def decode_batch(self, streams: Sequence[VaeStream], latents: torch.Tensor) -> list[torch.Tensor]:
        """Decode one chunk for each of B streams: latents (B, C, F, h, w), row b for ``streams[b]``.

        Streams in the same phase (fresh, one frame in, steady) run as one batched forward;
        streams in different phases run as one forward per phase. Returns B uint8 tensors
        (F'_b, 8h, 8w, 3) in the order of ``streams``.
        """
        return [to_uint8_frames(v) for v in self.decode_batch_float(streams, latents)]

    @torch.inference_mode()
    def decode_batch_float(self, streams: Sequence[VaeStream], latents: torch.Tensor) -> list[torch.Tensor]:
        """As ``decode_batch``, but the decoder's own output: float (3, F'_b, 8h, 8w) in [-1, 1]."""
        if latents.dim() != 5 or latents.shape[0] != len(streams) or latents.shape[1] != self.z_dim:
            raise ValueError(
                f"decode_batch takes latents (B={len(streams)}, C={self.z_dim}, F, h, w), got {tuple(latents.shape)}"
            )
        if len({id(s) for s in streams}) != len(streams):
            raise ValueError("decode_batch got the same stream twice")
        hw = (latents.shape[3], latents.shape[4])
        for i, s in enumerate(streams):
            if s.disposed:
                raise ValueError(f"stream {i} was disposed")
            if s.latent_hw is not None and s.latent_hw != hw:
                raise ValueError(f"stream {i} decodes latents of {s.latent_hw}, got a chunk of {hw}")
        out: list[torch.Tensor | None] = [None] * len(streams)
        phases = [s.phase for s in streams]  # fixed before any group decodes and moves on
        for phase in sorted(set(phases)):
            rows = [i for i, p in enumerate(phases) if p == phase]
            video = self._decode_group([streams[i] for i in rows], latents[rows])  # (b, 3, F', H, W)
            for i, v in zip(rows, video, strict=True):
                out[i] = v
        return [v for v in out if v is not None]

    def _decode_group(self, streams: list[VaeStream], z: torch.Tensor) -> torch.Tensor:
        """Decode streams of one phase together; z (b, C, F, h, w) normalised."""
        b, _, n, h, w = z.shape
        x = z.float() * self.std.to(z.device) + self.mean.to(z.device)  # (b, C, F, h, w) in the VAE's own scale
        x = self.vae.post_quant_conv(x.to(self.dtype))
        cache = _stack([s.feat_cache for s in streams])
        first = streams[0].latent_frames == 0
        pieces = []
        for i in range(n):
            one = x[:, :, i : i + 1]
            pieces.append(self.vae.decoder(one, feat_cache=cache, feat_idx=[0], first_chunk=first and i == 0))
        video = torch.cat(pieces, dim=2).clamp_(-1.0, 1.0)  # (b, 3, F', H, W)
        for s, c in zip(streams, _unstack(cache, b), strict=True):
            s.feat_cache[:] = c
            s.pixel_frames += pixel_frames_for(s.latent_frames, n)
            s.latent_frames += n
            s.latent_hw = (h, w)
        return video

    # -- encoding ---------------------------------------------------------------------------

    @torch.inference_mode()
    def encode_frames(self, frames: torch.Tensor) -> torch.Tensor:
        """Encode uint8 frames (F, H, W, 3), F = 1 + 4k, to normalised latents (C, 1 + k, H/8, W/8).

        The frames are a video's start (the encoder is causal too: its first frame is encoded
        alone); the latents are the posterior means, normalised like ``decode``'s input.
        """
        if frames.dim() != 4 or frames.shape[-1] != 3 or frames.dtype != torch.uint8:
            raise ValueError(f"encode_frames takes uint8 frames (F, H, W, 3), got {frames.dtype} {tuple(frames.shape)}")
        n, hh, ww, _ = frames.shape
        if (n - 1) % 4 != 0:
            raise ValueError(f"encode_frames takes 1 + 4k frames, got {n}")
        if hh % 8 or ww % 8:
            raise ValueError(f"frame size {hh}x{ww} is not a multiple of 8")
        x = frames.to(self.device).permute(3, 0, 1, 2)  # (3, F, H, W)
        return self.encode_video(x.to(self.dtype) / 127.5 - 1.0)

    @torch.inference_mode()
    def encode_video(self, video: torch.Tensor) -> torch.Tensor:
        """Encode a video (3, F, H, W) in [-1, 1], F = 1 + 4k, to normalised latents (C, 1 + k, H/8, W/8)."""
        if video.dim() != 4 or video.shape[0] != 3 or (video.shape[1] - 1) % 4:
            raise ValueError(f"encode_video takes (3, 1 + 4k, H, W) in [-1, 1], got {tuple(video.shape)}")
        mu = self.vae.encode(video[None].to(self.device, self.dtype)).latent_dist.mode()  # (1, C, 1 + k, H/8, W/8)
        return ((mu.float() - self.mean.to(mu.device)) / self.std.to(mu.device))[0]


def to_uint8_frames(video: torch.Tensor) -> torch.Tensor:
    """Decoder output (3, F, H, W) in [-1, 1] -> uint8 frames (F, H, W, 3)."""
    frames = ((video.float() + 1.0) * 127.5).round_().clamp_(0, 255).to(torch.uint8)
    return frames.permute(1, 2, 3, 0)


def feature_cache_bytes(config: dict, height: int, width: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of one stream's steady feature cache at a pixel size, computed on the meta device."""
    if height % 8 or width % 8:
        raise ValueError(f"frame size {height}x{width} is not a multiple of 8")
    with torch.device("meta"):
        vae = AutoencoderKLWan(**config)
    z = config.get("z_dim", 16)
    cache: list[CacheEntry] = [None] * sum(1 for m in vae.decoder.modules() if isinstance(m, WanCausalConv3d))
    for i in range(3):
        x = torch.empty(1, z, 1, height // 8, width // 8, device="meta")
        vae.decoder(x, feat_cache=cache, feat_idx=[0], first_chunk=i == 0)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return sum(e.numel() * itemsize for e in cache if isinstance(e, torch.Tensor))


def _stack(caches: list[list[CacheEntry]]) -> list[CacheEntry]:
    """Stack B streams' caches entry by entry on the batch axis (one phase: same kinds, same shapes)."""
    if len(caches) == 1:
        return list(caches[0])
    out: list[CacheEntry] = []
    for entries in zip(*caches, strict=True):
        e0 = entries[0]
        if isinstance(e0, torch.Tensor):
            out.append(torch.cat(entries, dim=0))  # (B, C_i, <=2, h_i, w_i)
        else:
            out.append(e0)  # None or "Rep": the same for every stream of a phase
    return out


def _unstack(cache: list[CacheEntry], b: int) -> list[list[CacheEntry]]:
    """Split a batched cache back into b streams' caches.

    Each stream gets its own copy: a view would keep the whole batched tensor alive for as long
    as any one stream of the batch holds it, so a session that next decodes alone or in another
    batch would leave its old rows behind.
    """
    if b == 1:
        return [cache]
    per = [[] for _ in range(b)]  # type: list[list[CacheEntry]]
    for e in cache:
        parts = [p.clone() for p in e.split(1, dim=0)] if isinstance(e, torch.Tensor) else [e] * b
        for p, part in zip(per, parts, strict=True):
            p.append(part)
    return per
