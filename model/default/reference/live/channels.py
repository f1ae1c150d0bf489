"""The live state as the network's channels: where the moving things are, never their pixels.

A frame's state channels (``STATE_CHANNELS`` of them, each (H, W) at the frame's bucket) say,
pixel by pixel, what lies there of the world's moving things, in world coordinates on the
torus; the network (``WorldModel._draw_state``) learns what each looks like:

    0-4    animals: footprint f, f*u, f*v, f*u^2, f*v^2     f = max(0, 1 - (u^2 + v^2)),
    5-9    boats:   the same                                u, v the pixel's place along and
    10-11  animals, boats: f * (+1 | -1) by variant         across the heading, over the reach
    12     cloud cover in [0, 1] (its shadow's strength is the scene's)
    13     fog density in [0, 1]

The footprint and its local axes give the drawing (``net/state_draw.py``) each pixel's place
in the actor's frame, from which it learns the actor's shape (a body and a head, a hull, a
sail, a wake). An actor is laid at the centre of the pixel it stands on, its heading to the
nearest of ``HEADING_STEPS`` directions, as the training worlds draw them. The reach
(``REACH``, world units) covers what the world draws of an actor. Training makes these
channels from the world's own actors and weather (``training/live_data.py``), serving from a session's live state
(``live/state.py``), with this one function.
"""

from __future__ import annotations

import numpy as np

ANIMAL, BOAT = 0, 1
KINDS = 2
VARIANTS = 2
AXES = 5  # f, f*u, f*v, f*u^2, f*v^2
CLOUD = KINDS * AXES + KINDS  # 12
FOG = CLOUD + 1  # 13
STATE_CHANNELS = FOG + 1  # 14
REACH = (4.0, 9.0)  # world units from an actor's place that its footprint covers, per kind
VIEW_UNITS = 64  # world units across every bucket's view
HEADING_STEPS = 16  # an actor's heading is laid to the nearest of these many directions


def actor_channels(
    out: np.ndarray, kind: np.ndarray, variant: np.ndarray, pos: np.ndarray, heading: np.ndarray,
    top_left: tuple[float, float], map_size: int,
) -> None:
    """Add the actors' footprints into ``out`` (STATE_CHANNELS, B, B) float32, in place.
    ``kind``, ``variant`` (N,) ints; ``pos`` (N, 2) world (y, x); ``heading`` (N,) radians,
    direction (sin, cos) = (dy, dx); ``top_left`` the view's corner in world units."""
    b = out.shape[-1]
    ppu = b / VIEW_UNITS
    if len(kind) == 0:
        return
    centre = np.asarray(top_left, np.float64) + VIEW_UNITS / 2
    d = (np.asarray(pos, np.float64) - centre + map_size / 2) % map_size - map_size / 2  # (N, 2) from the view's centre
    reach = np.asarray(REACH)[kind]
    near = np.all(np.abs(d) < VIEW_UNITS / 2 + reach[:, None], axis=1)
    if not near.any():
        return
    kind, variant, heading, reach = kind[near], variant[near], heading[near], reach[near]
    # the actors' places in pixels of the view, at the centre of the pixel they stand on, and
    # their headings in HEADING_STEPS steps: the training worlds lay each actor so
    py, px = (np.floor((d[near] + VIEW_UNITS / 2) * ppu) + 0.5).T  # (n,)
    heading = np.round(heading / (2 * np.pi) * HEADING_STEPS) * (2 * np.pi / HEADING_STEPS)
    span = int(np.ceil(max(REACH) * ppu)) + 1
    off = np.arange(-span, span + 1)
    iy = np.floor(py)[:, None].astype(np.int64) + off  # (n, S) pixel rows around each actor
    ix = np.floor(px)[:, None].astype(np.int64) + off
    dy = ((iy + 0.5) / ppu - py[:, None] / ppu)[:, :, None]  # (n, S, 1) world units from the actor
    dx = ((ix + 0.5) / ppu - px[:, None] / ppu)[:, None, :]  # (n, 1, S)
    s, c = np.sin(heading)[:, None, None], np.cos(heading)[:, None, None]
    r = reach[:, None, None]
    u = (dy * s + dx * c) / r  # (n, S, S) along the heading
    v = (dx * s - dy * c) / r  # across it
    f = np.maximum(0.0, 1.0 - (u * u + v * v))
    inside = (f > 0) & (iy[:, :, None] >= 0) & (iy[:, :, None] < b) & (ix[:, None, :] >= 0) & (ix[:, None, :] < b)
    a, yy, xx = np.nonzero(inside)
    rows, cols = iy[a, yy], ix[a, xx]
    ff, uu, vv = f[a, yy, xx], u[a, yy, xx], v[a, yy, xx]
    base = kind[a] * AXES
    for j, val in enumerate((ff, ff * uu, ff * vv, ff * uu * uu, ff * vv * vv)):
        np.add.at(out, (base + j, rows, cols), val.astype(np.float32))
    sign = np.where(variant[a] > 0, 1.0, -1.0)
    np.add.at(out, (KINDS * AXES + kind[a], rows, cols), (ff * sign).astype(np.float32))


def field_view(field: np.ndarray, top_left: tuple[float, float], bucket: int, period_units: float) -> np.ndarray:
    """A (bucket, bucket) view of a torus-tiling ``field`` (P, P) whose period is
    ``period_units`` world units, the view's corner at ``top_left`` (world units): each pixel
    centre's nearest texel."""
    p = field.shape[0]
    units = (np.arange(bucket) + 0.5) * (VIEW_UNITS / bucket)
    rows = np.floor((top_left[0] + units) * (p / period_units)).astype(np.int64) % p
    cols = np.floor((top_left[1] + units) * (p / period_units)).astype(np.int64) % p
    return field[rows[:, None], cols[None, :]]
