"""TAEHV's decoder for the Wan2.1 latents, streaming chunk by chunk: ``--vae tae``.

TAEHV (Ollin Boer Bohan's Tiny AutoEncoder for Hunyuan Video, with weights for Wan 2.1 in
``taew2_1.pth``) is what the Self-Forcing and StreamDiffusionV2 demos decode with in real time:
about 10 million parameters in its decoder against the Wan2.1 VAE decoder's 73 million, and a
state of one frame per memory block instead of two frames of every causal convolution. It
decodes exactly the latents the transformer makes (no mean and std: unlike the full VAE, it was
trained on the normalised latents), and gives pixels in [0, 1].

The decoder, layer by layer (the indices are the checkpoint's ``decoder.N`` keys)::

    0  clamp: 3 tanh(x / 3)             12 2x nearest upsample
    1  3x3 conv z -> w0, 2 ReLU         13 time grow x2: 1x1 conv w1 -> 2 w1, one frame to two
    3-5  memory blocks (w0)             14 3x3 conv w1 -> w2
    6  2x nearest upsample              15-17 memory blocks (w2)
    7  time grow x1 (a 1x1 conv)        18 2x nearest upsample
    8  3x3 conv w0 -> w1                19 time grow x2
    9-11 memory blocks (w1)             20 3x3 conv w2 -> w3, 21 ReLU, 22 3x3 conv w3 -> 3

with widths (w0, w1, w2, w3) = (256, 128, 64, 64) in ``taew2_1.pth``. A memory block sees its
input frame and the input frame before it (zeros before the first): three 3x3 convolutions
over both, plus a 1x1 skip of the frame, then ReLU. So a latent frame decodes to 4 pixel
frames, and a stream's state is, per memory block, the last frame it saw (``TaeStream``):
chunk after chunk, the frames equal one decode of the whole video. The first 3 frames of a
video are dropped, as TAEHV itself does, so a video of n latent frames gives 1 + 4 (n - 1)
frames, as the Wan2.1 VAE does: 9 for a first chunk of 3, then 12.

``TaeDecoder`` has ``StreamingDecoder``'s decoding interface (``open``, ``decode``,
``decode_batch``, ``decode_batch_float``), so a runner takes either. Encoding (Matrix-Game's
image condition) stays with the full VAE, which it is given where a runner encodes. Its
streams batch whatever their phase: a fresh stream's memory is zeros, which is what a first
frame sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from worldserve.model.wan.vae_stream import pixel_frames_for, to_uint8_frames

if TYPE_CHECKING:
    from worldserve.model.wan.vae_stream import StreamingDecoder

TAE_FILE = "taew2_1.pth"
TAE_REPO = "madebyollin/taehv"
TAE_WHERE = (f"the GitHub repository {TAE_REPO} publishes it at its top ({TAE_FILE}; the Self-Forcing demo "
             f"keeps it as checkpoints/{TAE_FILE})")
TRIM = 3  # frames TAEHV drops at a video's start: 4 per latent frame, 1 for the first
TIME_GROWS = {7: 1, 13: 2, 19: 2}  # layer index -> frames out per frame in
MEMORY_BLOCKS = (3, 4, 5, 9, 10, 11, 15, 16, 17)
TAE_WIDTHS = (256, 128, 64, 64)  # taew2_1.pth's


class _Clamp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 3.0 * torch.tanh(x / 3.0)


class _Memory(nn.Module):
    """A frame and the frame before it -> one frame; ``conv`` / ``skip`` are the checkpoint's names."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(2 * c_in, c_out, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(c_out, c_out, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(c_out, c_out, 3, padding=1))
        self.skip: nn.Module = nn.Conv2d(c_in, c_out, 1, bias=False) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(torch.cat([x, before], 1)) + self.skip(x))


class _Grow(nn.Module):
    """One frame -> ``stride`` frames: a 1x1 conv to ``stride`` times the channels, split in order."""

    def __init__(self, c: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(c, c * stride, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        return self.conv(x).reshape(n * self.stride, c, h, w)  # frame t's outputs are frames t*s .. t*s + s-1


def build_decoder(z_dim: int = 16, widths: tuple[int, int, int, int] = TAE_WIDTHS) -> nn.Sequential:
    """TAEHV's decoder with the checkpoint's layer indices (random weights)."""
    w0, w1, w2, w3 = widths
    conv = lambda a, b, bias=True: nn.Conv2d(a, b, 3, padding=1, bias=bias)  # noqa: E731
    return nn.Sequential(
        _Clamp(), conv(z_dim, w0), nn.ReLU(),
        _Memory(w0, w0), _Memory(w0, w0), _Memory(w0, w0), nn.Upsample(scale_factor=2), _Grow(w0, 1),
        conv(w0, w1, bias=False),
        _Memory(w1, w1), _Memory(w1, w1), _Memory(w1, w1), nn.Upsample(scale_factor=2), _Grow(w1, 2),
        conv(w1, w2, bias=False),
        _Memory(w2, w2), _Memory(w2, w2), _Memory(w2, w2), nn.Upsample(scale_factor=2), _Grow(w2, 2),
        conv(w2, w3, bias=False), nn.ReLU(), conv(w3, 3),
    )


def read_decoder(path: str | Path) -> tuple[dict[str, torch.Tensor], int, tuple[int, int, int, int]]:
    """The decoder's weights of a TAEHV checkpoint (``decoder.*``, prefix dropped), its latent
    channels and widths, read from the shapes."""
    from worldserve.model.wan.weights import WeightsError, read_tensors

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"TAEHV decoder file {path} does not exist; {TAE_WHERE}")
    state = {k.removeprefix("decoder."): v for k, v in read_tensors(path).items() if k.startswith("decoder.")}
    try:
        z_dim = int(state["1.weight"].shape[1])
        widths = tuple(int(state[f"{i}.weight"].shape[0]) for i in (1, 8, 14, 20))
    except KeyError as e:
        raise WeightsError(f"{path} is not a TAEHV checkpoint: no decoder weight {e}") from None
    return state, z_dim, widths  # type: ignore[return-value]


@dataclass(slots=True)
class TaeStream:
    """One session's TAEHV state: per memory block the last frame it saw (None: a fresh stream)."""

    memory: dict[int, torch.Tensor] = field(default_factory=dict)
    latent_frames: int = 0
    pixel_frames: int = 0
    latent_hw: tuple[int, int] | None = None
    disposed: bool = False

    @property
    def phase(self) -> int:
        return min(self.latent_frames, 2)

    @property
    def cache_bytes(self) -> int:
        return sum(m.numel() * m.element_size() for m in self.memory.values())

    def dispose(self) -> None:
        self.memory.clear()
        self.disposed = True


class TaeDecoder:
    """TAEHV's decoder behind ``StreamingDecoder``'s decoding interface; ``encoder``: the full
    VAE (a ``StreamingDecoder``) where the runner also encodes frames (Matrix-Game)."""

    def __init__(self, net: nn.Sequential, *, encoder: StreamingDecoder | None = None) -> None:
        self.net = net.eval().requires_grad_(False)
        first = net[1]
        assert isinstance(first, nn.Conv2d)
        self.z_dim: int = int(first.in_channels)
        self.encoder = encoder
        if encoder is not None and encoder.z_dim != self.z_dim:
            raise ValueError(f"TAEHV decodes {self.z_dim} latent channels, the VAE encodes {encoder.z_dim}")

    @classmethod
    def load(cls, path: str | Path, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
             encoder: StreamingDecoder | None = None) -> TaeDecoder:
        state, z_dim, widths = read_decoder(path)
        net = build_decoder(z_dim, widths)
        missing, unexpected = net.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{path} does not match TAEHV's decoder: missing {sorted(missing)[:4]}, "
                             f"unexpected {sorted(unexpected)[:4]}")
        return cls(net.to(device, dtype), encoder=encoder)

    @property
    def device(self) -> torch.device:
        return next(self.net.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.net.parameters()).dtype

    def open(self) -> TaeStream:
        return TaeStream()

    def dispose(self, stream: TaeStream) -> None:
        stream.dispose()

    @torch.inference_mode()
    def decode(self, stream: TaeStream, latents: torch.Tensor) -> torch.Tensor:
        """One chunk (C, F, h, w) or (1, C, F, h, w) -> uint8 frames (F', 8h, 8w, 3)."""
        if latents.dim() == 4:
            latents = latents.unsqueeze(0)
        return self.decode_batch([stream], latents)[0]

    @torch.inference_mode()
    def decode_batch(self, streams: Sequence[TaeStream], latents: torch.Tensor) -> list[torch.Tensor]:
        return [to_uint8_frames(v) for v in self.decode_batch_float(streams, latents)]

    @torch.inference_mode()
    def decode_batch_float(self, streams: Sequence[TaeStream], latents: torch.Tensor) -> list[torch.Tensor]:
        """One chunk for each of B streams, latents (B, C, F, h, w) as the transformer makes them
        -> B float videos (3, F'_b, 8h, 8w) in [-1, 1]; each stream's memory moves on."""
        if latents.dim() != 5 or latents.shape[0] != len(streams) or latents.shape[1] != self.z_dim:
            raise ValueError(f"decode_batch takes latents (B={len(streams)}, C={self.z_dim}, F, h, w), "
                             f"got {tuple(latents.shape)}")
        if len({id(s) for s in streams}) != len(streams):
            raise ValueError("decode_batch got the same stream twice")
        b, _, n, h, w = latents.shape
        for i, s in enumerate(streams):
            if s.disposed:
                raise ValueError(f"stream {i} was disposed")
            if s.latent_hw is not None and s.latent_hw != (h, w):
                raise ValueError(f"stream {i} decodes latents of {s.latent_hw}, got a chunk of {(h, w)}")
        x = latents.to(self.device, self.dtype).permute(0, 2, 1, 3, 4).reshape(b * n, self.z_dim, h, w)
        t = n  # frames per stream at the current layer
        for i, layer in enumerate(self.net):
            if isinstance(layer, _Memory):
                frames = x.reshape(b, t, *x.shape[1:])
                last = torch.stack([s.memory[i] if i in s.memory else torch.zeros_like(frames[0, 0])
                                    for s in streams])
                before = torch.cat([last[:, None], frames[:, :-1]], 1).reshape(x.shape)
                for s, m in zip(streams, frames[:, -1], strict=True):
                    s.memory[i] = m.clone()
                x = layer(x, before)
            else:
                x = layer(x)
                if isinstance(layer, _Grow):
                    t *= layer.stride
        video = x.reshape(b, t, 3, x.shape[-2], x.shape[-1]).float().mul(2.0).sub(1.0).clamp(-1.0, 1.0)
        out = []
        for s, v in zip(streams, video, strict=True):
            first = s.latent_frames == 0
            s.pixel_frames += pixel_frames_for(s.latent_frames, n)
            s.latent_frames += n
            s.latent_hw = (h, w)
            out.append((v[TRIM:] if first else v).permute(1, 0, 2, 3))  # (3, F', H, W)
        return out

    # -- encoding: the full VAE's ---------------------------------------------------------

    def _encoder(self) -> StreamingDecoder:
        if self.encoder is None:
            raise ValueError("TAEHV decodes only here: encoding needs the full VAE")
        return self.encoder

    def encode_frames(self, frames: torch.Tensor) -> torch.Tensor:
        return self._encoder().encode_frames(frames)

    def encode_video(self, video: torch.Tensor) -> torch.Tensor:
        return self._encoder().encode_video(video)


def find_tae(weights: str | Path, vae: Path | None = None) -> Path:
    """``taew2_1.pth`` in a ``--weights`` directory: at its top, under ``checkpoints/`` (where the
    Self-Forcing demo keeps it) or beside the VAE; FileNotFoundError naming it and its publisher."""
    root = Path(weights)
    candidates = [root / TAE_FILE, root / "checkpoints" / TAE_FILE]
    if vae is not None:
        candidates.append((vae if vae.is_dir() else vae.parent) / TAE_FILE)
    for c in candidates:
        if c.is_file():
            return c
    looked = ", ".join(str(c) for c in dict.fromkeys(candidates))
    raise FileNotFoundError(f"{TAE_FILE} (TAEHV's decoder for --vae tae) not found (looked at {looked}); {TAE_WHERE}")
