"""Camera dynamics of the world, and global-motion measurement on frames.

Dynamics (one ``World.step`` = one frame). The action vector is session/plan.py's
``[forward, back, left, right, mouse_dx, mouse_dy]``; keys are clipped to [0, 1] and
mouse to [-1, 1]. The camera centre (y, x), in world units, moves by::

    vy = KEY_SPEED * (back - forward) + MOUSE_SPEED * mouse_dy
    vx = KEY_SPEED * (right - left) + MOUSE_SPEED * mouse_dx

with KEY_SPEED = MOUSE_SPEED = 2 units/frame, so forward is up on screen (-y), combos
add (forward+right is a diagonal; forward+back cancels), and the camera moves at most
4 units per frame per axis. The camera sees VIEW × VIEW = 64 × 64 world units at every
resolution bucket, ``bucket / 64`` pixels per unit; the static scene therefore shifts by
``-v * bucket / 64`` pixels: at most ±4 px per axis at 64 px, ±8 px at 128 px.
Positions wrap on the world torus (``World.map_size``).
"""

from __future__ import annotations

import numpy as np

from worldserve.protocol.vocab import ACTION_DIM, KEYS

VIEW = 64  # world units seen by the camera, per side
KEY_SPEED = 2.0  # world units per frame for a held movement key
MOUSE_SPEED = 2.0  # world units per frame at full mouse deflection
_FWD, _BACK, _LEFT, _RIGHT = (KEYS.index(k) for k in ("forward", "back", "left", "right"))
_MX, _MY = len(KEYS), len(KEYS) + 1


def camera_velocity(action: np.ndarray) -> tuple[float, float]:
    """Camera motion (vy, vx) in world units for one frame under ``action``."""
    a = np.asarray(action, dtype=np.float64).reshape(-1)
    if a.shape[0] != ACTION_DIM:
        raise ValueError(f"action has {a.shape[0]} entries, expected ACTION_DIM={ACTION_DIM}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"action {a.tolist()} has non-finite entries")
    keys = np.clip(a[: len(KEYS)], 0.0, 1.0)
    mx, my = np.clip(a[_MX], -1.0, 1.0), np.clip(a[_MY], -1.0, 1.0)
    vy = KEY_SPEED * (keys[_BACK] - keys[_FWD]) + MOUSE_SPEED * my
    vx = KEY_SPEED * (keys[_RIGHT] - keys[_LEFT]) + MOUSE_SPEED * mx
    return float(vy), float(vx)


def expected_shift(action: np.ndarray, bucket: int) -> tuple[float, float]:
    """Pixel shift (dy, dx) of the static scene between two frames at ``bucket``:
    frame t ≈ frame t-1 shifted by (dy, dx), i.e. ``np.roll(prev, (dy, dx), (0, 1))``."""
    vy, vx = camera_velocity(action)
    ppu = bucket / VIEW
    return -vy * ppu + 0.0, -vx * ppu + 0.0


def _gray(frame: np.ndarray, despeckle: int = 0) -> np.ndarray:
    f = np.asarray(frame, dtype=np.float64)
    if f.ndim == 3:
        f = f @ np.array([0.299, 0.587, 0.114])
    if despeckle > 1:
        f = median_filter(f, despeckle)
    return f - f.mean()


def median_filter(f: np.ndarray, size: int) -> np.ndarray:
    """Median over a ``size`` × ``size`` window (edges replicated): removes specks smaller
    than half the window (snowflakes, rain streaks) and keeps the ground's edges."""
    h, w = f.shape
    r = size // 2
    p = np.pad(f, r, mode="edge")
    return np.median(np.stack([p[dy : dy + h, dx : dx + w] for dy in range(size) for dx in range(size)]), 0)


def global_shift(
    prev: np.ndarray, cur: np.ndarray, max_shift: int | None = None, *,
    despeckle: int = 0, band: float | None = None,
) -> tuple[int, int]:
    """Integer (dy, dx) with ``cur ≈ np.roll(prev, (dy, dx), (0, 1))``, by phase correlation.

    Frames are (H, W) or (H, W, 3), any dtype. A Hann window tames the border; the peak
    is searched within ±``max_shift`` pixels (default a quarter of the frame side).
    ``despeckle``: median-filter both frames over that window first, so falling snow or
    rain (specks that move on their own) does not outvote the ground. ``band``: weight
    the whitened spectrum by a Gaussian of that many cycles per pixel (band-limited phase
    correlation), so fine texture that changes between frames counts less than the shapes.
    """
    a, b = _gray(prev, despeckle), _gray(cur, despeckle)
    if a.shape != b.shape:
        raise ValueError(f"frame shapes differ: {a.shape} vs {b.shape}")
    h, w = a.shape
    win = np.outer(np.hanning(h), np.hanning(w))
    fa, fb = np.fft.fft2(a * win), np.fft.fft2(b * win)
    cross = fb * np.conj(fa)
    spectrum = cross / (np.abs(cross) + 1e-9)
    if band is not None:
        fy, fx = np.fft.fftfreq(h)[:, None], np.fft.fftfreq(w)[None, :]
        spectrum = spectrum * np.exp(-(fy**2 + fx**2) / (2 * band**2))
    corr = np.fft.ifft2(spectrum).real
    limit = min(h, w) // 4 if max_shift is None else max_shift
    dy = (np.arange(h) + h // 2) % h - h // 2  # signed shift of each row of corr
    dx = (np.arange(w) + w // 2) % w - w // 2
    outside = (np.abs(dy)[:, None] > limit) | (np.abs(dx)[None, :] > limit)
    corr[outside] = -np.inf
    iy, ix = np.unravel_index(int(np.argmax(corr)), corr.shape)
    return int(dy[iy]), int(dx[ix])
