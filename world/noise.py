"""Tileable smooth noise on a torus, numpy only.

Value noise: a random lattice of ``n_cells × n_cells`` values, interpolated with the
cubic B-spline (four taps per axis, smooth to the second derivative, no grid-aligned
creases) and evaluated separably: rows first, then columns. The lattice wraps, so the
result tiles with period ``size`` texels. Only gathers, products and sums: no BLAS,
no transcendental functions, so a seed gives the same field bit for bit on one machine.
"""

from __future__ import annotations

import numpy as np


def _bspline_taps(n_cells: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Lattice indices (size, 4) and cubic B-spline weights (size, 4) per output sample."""
    t = (np.arange(size, dtype=np.float64) + 0.5) * (n_cells / size)
    j = np.floor(t).astype(np.int64)
    f = t - j
    f2 = f * f
    f3 = f2 * f
    weights = np.stack(
        [
            (1.0 - f) ** 3 / 6.0,
            (3.0 * f3 - 6.0 * f2 + 4.0) / 6.0,
            (-3.0 * f3 + 3.0 * f2 + 3.0 * f + 1.0) / 6.0,
            f3 / 6.0,
        ],
        axis=1,
    ).astype(np.float32)
    idx = (j[:, None] + np.arange(-1, 3)[None, :]) % n_cells
    return idx, weights


def value_noise(rng: np.random.Generator, n_cells: int, size: int) -> np.ndarray:
    """One octave: (size, size) float32, lattice values uniform in [0, 1)."""
    if n_cells < 1 or size < 1:
        raise ValueError(f"n_cells={n_cells} and size={size} must be positive")
    lattice = rng.random((n_cells, n_cells), dtype=np.float32)
    idx, w = _bspline_taps(n_cells, size)
    rows = sum(lattice[idx[:, k]] * w[:, k, None] for k in range(4))  # (size, n_cells)
    return sum(rows[:, idx[:, k]] * w[None, :, k] for k in range(4))  # (size, size)


def fractal_noise(
    rng: np.random.Generator,
    size: int,
    periods: tuple[int, ...],
    persistence: float = 0.5,
) -> np.ndarray:
    """Sum of octaves, normalised to [0, 1]. ``periods`` are in texels and must divide
    ``size`` (so every octave tiles); the first is the coarsest, with weight 1."""
    out = np.zeros((size, size), dtype=np.float32)
    amp = 1.0
    for period in periods:
        if period < 1 or size % period:
            raise ValueError(f"noise period {period} must divide the field size {size}")
        out += np.float32(amp) * value_noise(rng, size // period, size)
        amp *= persistence
    lo, hi = float(out.min()), float(out.max())
    return (out - lo) / np.float32(max(hi - lo, 1e-6))


def upsample(field: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of a tileable (n, n) field to (size, size), wrapping at the edges.
    Sample centres line up: texel i of the output sits at (i + 0.5) * n / size."""
    n = field.shape[0]
    field = field.astype(np.float32, copy=False)
    if size == n:
        return field.copy()
    if size % n == 0:
        return _upsample_axis_int(_upsample_axis_int(field, size // n, 0), size // n, 1)
    t = (np.arange(size, dtype=np.float64) + 0.5) * (n / size) - 0.5
    j = np.floor(t).astype(np.int64)
    f = (t - j).astype(np.float32)
    j0, j1 = j % n, (j + 1) % n
    rows = field[j0] * (1.0 - f)[:, None] + field[j1] * f[:, None]  # (size, n)
    return rows[:, j0] * (1.0 - f)[None, :] + rows[:, j1] * f[None, :]  # (size, size)


def _upsample_axis_int(field: np.ndarray, factor: int, axis: int) -> np.ndarray:
    """Integer-factor bilinear upsampling along one axis with strided writes (no gathers)."""
    shape = list(field.shape)
    shape[axis] *= factor
    out = np.empty(shape, dtype=np.float32)
    prev = np.roll(field, 1, axis=axis)
    nxt = np.roll(field, -1, axis=axis)
    for phase in range(factor):
        offset = (phase + 0.5) / factor - 0.5  # in (-0.5, 0.5), source texel units
        other = prev if offset < 0 else nxt
        w = np.float32(abs(offset))
        sl = [slice(None)] * field.ndim
        sl[axis] = slice(phase, None, factor)
        out[tuple(sl)] = field * (1.0 - w) + other * w
    return out
