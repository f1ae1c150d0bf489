"""Rotary positions over (time, y, x) that never grow without bound.

A head's dims are split into rotation pairs ``(i, i + D/2)``. The first ``time_rope_dims/2``
pairs rotate with the frame time, the rest split evenly between the token's row and column.

Keys are stored in the KV cache rotated in space only; their time rotation is applied when
a chunk reads them, with the time *relative to the chunk* (``frame - chunk_start``), so frame
100,000 looks exactly like frame 100 to the network. The full-sequence path rotates queries
and keys by absolute time instead; rotations are relative, so both give the same scores.

Sink frames (the first frames of an epoch) carry no time at all: their keys' time dims are
zeroed (cos = sin = 0), so their distance to the current chunk, which grows forever, never
reaches the network.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worldserve.model.default.net.config import ModelConfig


@dataclass(slots=True)
class Rope:
    """cos / sin tables of shape (N, head_dim), N = tokens they apply to."""

    cos: torch.Tensor
    sin: torch.Tensor
    identity: bool = False  # known on the host to rotate by nothing: ``apply`` is free

    def apply(self, x: torch.Tensor, extra_dims: int = 0) -> torch.Tensor:
        """Rotate ``x`` (..., N, H, D) token-wise. Tables are (N, D), shared by the batch,
        or (..., N, D), one per batch row; they broadcast over heads and over
        ``extra_dims`` more axes between N and H (q and k stacked)."""
        if self.identity:
            return x
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        shape = (*self.cos.shape[:-1], *([1] * (extra_dims + 1)), self.cos.shape[-1])
        return torch.addcmul(x * self.cos.view(shape), rotated, self.sin.view(shape))

    def to(self, dtype: torch.dtype, device: torch.device | str | None = None) -> Rope:
        return Rope(self.cos.to(device, dtype), self.sin.to(device, dtype), self.identity)


def _freqs(n_pairs: int, theta: float) -> torch.Tensor:
    return theta ** (-torch.arange(n_pairs, dtype=torch.float64) / max(n_pairs, 1))


class RopeTables:
    """Builds the rotation tables a config needs; cached per bucket on first use."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        half = cfg.head_dim // 2
        self.t_pairs = cfg.time_rope_dims // 2
        s_pairs = half - self.t_pairs
        self.y_pairs = s_pairs // 2
        self.x_pairs = s_pairs - self.y_pairs
        self.f_t = _freqs(self.t_pairs, cfg.rope_theta)
        self.f_y = _freqs(self.y_pairs, cfg.rope_theta)
        self.f_x = _freqs(self.x_pairs, cfg.rope_theta)
        self._spatial: dict[int, Rope] = {}
        self._spatial_frames: dict[tuple[int, int, torch.dtype, torch.device], Rope] = {}

    def _table(self, angles: torch.Tensor, keep: torch.Tensor | None = None) -> Rope:
        """angles (N, D/2) -> Rope; ``keep`` (N, D/2) zeroes pairs where it is 0."""
        cos, sin = torch.cos(angles), torch.sin(angles)
        if keep is not None:
            cos, sin = cos * keep, sin * keep
        return Rope(torch.cat((cos, cos), -1).float(), torch.cat((sin, sin), -1).float())

    def spatial(self, bucket: int) -> Rope:
        """Rotation by (y, x) for one frame's tokens in raster order, time dims untouched."""
        if bucket not in self._spatial:
            g = self.cfg.grid(bucket)
            unit = self.cfg.grid(self.cfg.base_bucket) / g  # same field of view in every bucket
            ys, xs = torch.meshgrid(torch.arange(g), torch.arange(g), indexing="ij")
            ys = ys.reshape(-1).double() * unit
            xs = xs.reshape(-1).double() * unit
            angles = torch.cat(
                (
                    torch.zeros(g * g, self.t_pairs, dtype=torch.float64),
                    ys[:, None] * self.f_y[None],
                    xs[:, None] * self.f_x[None],
                ),
                -1,
            )
            self._spatial[bucket] = self._table(angles)
        return self._spatial[bucket]

    def spatial_frames(
        self, bucket: int, frames: int, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> Rope:
        """``spatial(bucket)`` repeated for ``frames`` frames, in ``dtype`` on ``device`` (cached)."""
        key = (bucket, frames, dtype, torch.device(device))
        if key not in self._spatial_frames:
            sp = self.spatial(bucket)
            self._spatial_frames[key] = Rope(sp.cos.repeat(frames, 1), sp.sin.repeat(frames, 1)).to(dtype, device)
        return self._spatial_frames[key]

    def time(self, times: torch.Tensor, is_sink: torch.Tensor, tokens: int) -> Rope:
        """Rotation by frame time for ``len(times)`` frames of ``tokens`` tokens each.

        ``times`` (N,) frame times (absolute or relative to the chunk); ``is_sink`` (N,) bool:
        those frames get their time dims zeroed. Spatial dims are left untouched. The tables
        are built on the host; callers move them with ``Rope.to``.
        """
        times, is_sink = times.cpu(), is_sink.cpu()
        n = times.shape[0]
        half = self.cfg.head_dim // 2
        angles = torch.zeros(n, half, dtype=torch.float64)
        angles[:, : self.t_pairs] = times.double()[:, None] * self.f_t[None]
        keep = torch.ones(n, half, dtype=torch.float64)
        keep[:, : self.t_pairs] = (~is_sink.bool()).double()[:, None]
        table = self._table(angles, keep)
        return Rope(table.cos.repeat_interleave(tokens, 0), table.sin.repeat_interleave(tokens, 0))
