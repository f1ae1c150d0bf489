"""Measures of what moves in a run of consecutive frames: ``bench.realism_motion``'s tests.

Frames are (T, H, W, 3) uint8 of one session; ``cam`` (T, 2) is the camera's place in pixels
(y, x) at each frame, summed from the actions (``camera_px``): the ground seen at pixel p at
frame t lies at ground pixel p + cam[t] (a fixed thing's ground pixel does not change).

- Actors (``link_tracks``, ``track_speeds``, ``continuity``): the detector's actors
  (``bench.actor_detector``) linked frame to frame into tracks, in ground pixels, by nearest
  neighbour of the same kind within ``LINK_PX`` (one missed frame bridged within
  ``2 * LINK_PX``); a track's speed is its ground displacement over ``SPEED_SPAN`` frames; its
  continuity, the share of its next ``CONTINUITY_SPAN`` frames in view it stays tracked.
- Moving weather (``weather_field``, ``cover``, ``drift``): the frame against the world's own
  ground at the same place (``World.render_ground``: no actors, glints, shadows or fog), as a
  log-brightness ratio, smoothed: a cloud shadow reads below 0, fog as lost contrast. Cover:
  the share of pixels darker than the ground by ``SHADOW_DROP``; haze: one minus the ratio of
  the frame's local contrast to the ground's. Drift: the shift that best aligns the ratio field
  of frame t with that of frame t - k moved by the camera (``pair_gap``), over k: pixels a frame.
- ``motion_pairs`` and ``motion_c2st``: the two-sample test on frame pairs. Each sample is
  frame t and its difference from frame t - k moved onto it by the camera (whole pixels), each
  pixel against the nearest match within 1 px (``steady_difference``: the camera's sub-pixel
  rest does not count), zero where t - k did not see; a small network with max pooling (the evidence of
  motion is a few pixels: one animal that walked) is trained to tell two sets of such pairs,
  cross-fitted over worlds like ``_realism_measures.c2st_readings``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from worldserve.bench._realism_measures import fit_binary, world_folds
from worldserve.world import VIEW, camera_velocity

LINK_PX = 2.5  # px: a detection within this of a track's last ground place continues it
SPEED_SPAN = 12  # frames: a track's speed is its displacement over this span
CONTINUITY_SPAN = 24  # frames a tracked actor is followed for its continuity
EDGE_PX = 3  # px: a place this near the edge counts as out of view
SHADOW_DROP = 0.06  # a pixel darker than the ground by this (log ratio) is in shadow
GAPS = (24, 16, 12, 8, 4, 2, 1)  # frame gaps of a pair, longest first; the longest that keeps the view
MAX_PAIR_SHIFT = 24  # px: the camera may move at most this between a pair's frames (40 of 64 px still seen)
DRIFT_REACH = 12  # px searched each way for the drift


def camera_px(actions: np.ndarray, bucket: int) -> np.ndarray:
    """(T, A) actions -> (T, 2) the camera's place in pixels (y, x), 0 at frame 0 (action 0 is
    never taken: frame 0 is the start)."""
    v = np.array([camera_velocity(a) for a in actions], np.float64) * (bucket / VIEW)
    v[0] = 0
    return np.cumsum(v, 0)


# -- actors --------------------------------------------------------------------------------


@dataclass
class Track:
    kind: int
    frames: list[int] = field(default_factory=list)
    ground: list[np.ndarray] = field(default_factory=list)  # (2,) ground px per frame

    @property
    def last(self) -> int:
        return self.frames[-1]


def link_tracks(dets: list[tuple[np.ndarray, np.ndarray]], cam: np.ndarray, radius: float = LINK_PX) -> list[Track]:
    """Tracks from per-frame detections ((M, 2) px, (M,) kind), greedy nearest first; a
    track missing one frame may continue within ``2 * radius``."""
    tracks: list[Track] = []
    live: list[Track] = []
    for t, (px, kind) in enumerate(dets):
        g = px.astype(np.float64) + cam[t]
        live = [tr for tr in live if t - tr.last <= 2]
        taken: set[int] = set()
        cands = []
        for ti, tr in enumerate(live):
            reach = radius * (t - tr.last)
            for j in np.flatnonzero(kind == tr.kind):
                d = float(np.linalg.norm(g[j] - tr.ground[-1]))
                if d <= reach:
                    cands.append((t - tr.last, d, ti, int(j)))
        used_t: set[int] = set()
        for _, _, ti, j in sorted(cands):
            if ti in used_t or j in taken:
                continue
            used_t.add(ti)
            taken.add(j)
            live[ti].frames.append(t)
            live[ti].ground.append(g[j])
        for j in range(len(kind)):
            if j not in taken:
                tr = Track(int(kind[j]), [t], [g[j]])
                tracks.append(tr)
                live.append(tr)
    return tracks


def track_speeds(tracks: list[Track], span: int = SPEED_SPAN) -> dict[int, list[float]]:
    """kind -> speeds (px a frame) of every track over each ``span`` frames it lasts (from its
    first frame, stepping by ``span``)."""
    out: dict[int, list[float]] = {}
    for tr in tracks:
        at = dict(zip(tr.frames, tr.ground, strict=True))
        t0 = tr.frames[0]
        while t0 + span <= tr.last:
            if t0 in at and t0 + span in at:
                out.setdefault(tr.kind, []).append(float(np.linalg.norm(at[t0 + span] - at[t0])) / span)
            t0 += span
    return out


def continuity(tracks: list[Track], cam: np.ndarray, size: int, starts: range, span: int = CONTINUITY_SPAN,
               edge: int = EDGE_PX) -> dict[int, list[float]]:
    """kind -> per tracked actor first seen at a frame of ``starts`` (away from the edge): the
    share of its next ``span`` frames in view (its last ground place, seen from the camera then,
    inside the edge) that its track lasts, bridged gaps counted as kept."""
    out: dict[int, list[float]] = {}
    n = len(cam)
    for tr in tracks:
        s = tr.frames[0]
        if s not in starts or s + span > n:
            continue
        p0 = tr.ground[0] - cam[s]
        if not (edge <= p0[0] < size - edge and edge <= p0[1] < size - edge):
            continue
        at = dict(zip(tr.frames, tr.ground, strict=True))
        kept = in_view = 0
        alive, g = True, tr.ground[0]
        for t in range(s, s + span):
            if t in at:
                g = at[t]
            alive = alive and t <= tr.last
            p = g - cam[t]
            seen = edge <= p[0] < size - edge and edge <= p[1] < size - edge
            if alive or seen:
                in_view += 1
                kept += alive
        out.setdefault(tr.kind, []).append(kept / max(in_view, 1))
    return out


# -- moving weather ------------------------------------------------------------------------


def _lum(frames: np.ndarray) -> np.ndarray:
    return frames.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)


def _box(x: np.ndarray, r: int) -> np.ndarray:
    """Box mean over (2r + 1)^2 of (N, H, W), edges replicated."""
    t = torch.from_numpy(np.ascontiguousarray(x, np.float32))[:, None]
    t = F.avg_pool2d(F.pad(t, (r, r, r, r), mode="replicate"), 2 * r + 1, 1)
    return t[:, 0].numpy()


def weather_field(frames: np.ndarray, grounds: np.ndarray, r: int = 2) -> np.ndarray:
    """(T, H, W) log-brightness of the frames over the world's ground at the same places,
    box-smoothed (radius ``r``): 0 where nothing lies over the ground, below 0 in shadow."""
    return _box(np.log(_lum(frames) + 8) - np.log(_lum(grounds) + 8), r)


def cover(field_: np.ndarray, drop: float = SHADOW_DROP) -> float:
    """The share of pixels in shadow (darker than the ground by ``drop``)."""
    return float((field_ < -drop).mean())


def haze(frames: np.ndarray, grounds: np.ndarray, r: int = 3) -> float:
    """One minus the ratio of the frames' local contrast (luminance deviation over boxes of
    radius ``r``) to the ground's: 0 for a clear view, toward 1 under thick fog."""
    def dev(x: np.ndarray) -> np.ndarray:
        return np.sqrt(np.clip(_box(x * x, r) - _box(x, r) ** 2, 0, None))
    ld, gd = dev(_lum(frames)), dev(_lum(grounds))
    ok = gd > 2.0
    return float(1 - ld[ok].sum() / max(gd[ok].sum(), 1e-6)) if ok.any() else 0.0


def pair_gap(cam: np.ndarray, t: int, gaps: tuple[int, ...] = GAPS, reach: float = MAX_PAIR_SHIFT) -> int:
    """The longest gap k of ``gaps`` (k <= t) over which the camera moved at most ``reach``
    px on each axis; 0 when none does."""
    for k in gaps:
        if k <= t and np.abs(cam[t] - cam[t - k]).max() <= reach:
            return k
    return 0


def shift_bilinear(img: np.ndarray, dy: float, dx: float) -> tuple[np.ndarray, np.ndarray]:
    """(H, W, ...) image moved by (dy, dx) px (content at p goes to p + d), bilinear, and the
    (H, W) mask of pixels it covers."""
    h, w = img.shape[:2]
    yy, xx = np.mgrid[:h, :w].astype(np.float64)
    sy, sx = yy - dy, xx - dx
    valid = (sy >= 0) & (sy <= h - 1) & (sx >= 0) & (sx <= w - 1)
    y0, x0 = np.clip(np.floor(sy), 0, h - 1).astype(int), np.clip(np.floor(sx), 0, w - 1).astype(int)
    y1, x1 = np.clip(y0 + 1, 0, h - 1), np.clip(x0 + 1, 0, w - 1)
    fy, fx = np.clip(sy - y0, 0, 1), np.clip(sx - x0, 0, 1)
    if img.ndim == 3:
        fy, fx = fy[..., None], fx[..., None]
    f = img.astype(np.float32)
    out = (f[y0, x0] * (1 - fy) * (1 - fx) + f[y0, x1] * (1 - fy) * fx + f[y1, x0] * fy * (1 - fx)
           + f[y1, x1] * fy * fx)
    return out.astype(np.float32), valid


def _overlap(cur: np.ndarray, prev: np.ndarray, valid: np.ndarray, dy: int, dx: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``cur`` and ``prev`` moved by (dy, dx) on their common pixels: (a, b, mask), same shape."""
    h, w = cur.shape
    ys, yd = (slice(0, h - dy), slice(dy, h)) if dy >= 0 else (slice(-dy, h), slice(0, h + dy))
    xs, xd = (slice(0, w - dx), slice(dx, w)) if dx >= 0 else (slice(-dx, w), slice(0, w + dx))
    return cur[yd, xd], prev[ys, xs], valid[ys, xs]


def drift(fields: np.ndarray, cam: np.ndarray, times: range, reach: int = DRIFT_REACH,
          min_dev: float = 0.01) -> tuple[float, float, int]:
    """The weather's drift (vy, vx) in px a frame: for each frame t of ``times`` whose field
    varies (std > ``min_dev``), the integer shift d (|d| <= ``reach``) that best correlates its
    field with frame t - k's moved by the camera (``pair_gap``), as d / k; the median over the
    frames, and how many there were. (nan, nan, 0) where no frame qualifies."""
    vel = []
    for t in times:
        k = pair_gap(cam, t)
        if k == 0 or fields[t].std() < min_dev:
            continue
        dcam = cam[t] - cam[t - k]
        prev, valid = shift_bilinear(fields[t - k], -dcam[0], -dcam[1])  # t - k's field on frame t
        best, best_d = -np.inf, (0, 0)
        for dy in range(-reach, reach + 1):
            for dx in range(-reach, reach + 1):
                a, b, ok = _overlap(fields[t], prev, valid, dy, dx)
                if ok.sum() < 256:
                    continue
                a, b = a[ok] - a[ok].mean(), b[ok] - b[ok].mean()
                c = float((a * b).sum() / (np.sqrt((a * a).sum() * (b * b).sum()) + 1e-9))
                if c > best:
                    best, best_d = c, (dy, dx)
        vel.append((best_d[0] / k, best_d[1] / k))
    if not vel:
        return float("nan"), float("nan"), 0
    v = np.median(np.array(vel), 0)
    return float(v[0]), float(v[1]), len(vel)


# -- the motion two-sample test --------------------------------------------------------------


def shift_whole(img: np.ndarray, dy: int, dx: int) -> tuple[np.ndarray, np.ndarray]:
    """(H, W, ...) image moved by whole pixels (content at p goes to p + d), and the (H, W) mask
    of pixels it covers (elsewhere 0)."""
    h, w = img.shape[:2]
    out = np.zeros_like(img)
    valid = np.zeros((h, w), bool)
    ys, yd = (slice(0, h - dy), slice(dy, h)) if dy >= 0 else (slice(-dy, h), slice(0, h + dy))
    xs, xd = (slice(0, w - dx), slice(dx, w)) if dx >= 0 else (slice(-dx, w), slice(0, w + dx))
    if abs(dy) < h and abs(dx) < w:
        out[yd, xd] = img[ys, xs]
        valid[yd, xd] = True
    return out, valid


def steady_difference(cur: np.ndarray, prev: np.ndarray, valid: np.ndarray, reach: int = 1) -> np.ndarray:
    """(H, W) float32: per pixel of ``cur``, how far (largest channel, grey levels) its colour lies
    outside the range of ``prev``'s colours within ``reach`` px; 0 outside ``valid`` shrunk by
    ``reach + 1``. A pixel resampled from its neighbours (the camera's sub-pixel rest: the
    renderer's ground is read bilinearly, its sprites and shadows snap to whole pixels) lies in
    their range; what moved in over something else does not."""
    c = torch.from_numpy(cur.astype(np.float32)).permute(2, 0, 1)[None]  # (1, 3, H, W)
    p = torch.from_numpy(prev.astype(np.float32)).permute(2, 0, 1)[None]
    k = 2 * reach + 1
    hi = F.max_pool2d(F.pad(p, (reach,) * 4, mode="replicate"), k, 1)
    lo = -F.max_pool2d(F.pad(-p, (reach,) * 4, mode="replicate"), k, 1)
    out = torch.maximum(lo - c, c - hi).clamp(min=0).amax(1)[0].numpy()  # (H, W)
    m = torch.from_numpy(valid.astype(np.float32))[None, None]
    r = reach + 1
    inner = 1 - F.max_pool2d(F.pad(1 - m, (r, r, r, r), value=1.0), 2 * r + 1, 1)  # valid shrunk by r (edges too)
    return np.where(inner[0, 0].numpy() > 0.5, out, 0).astype(np.float32)


def motion_pairs(frames: np.ndarray, cam: np.ndarray, times: range) -> np.ndarray:
    """(len(times), 5, H, W) float32 samples: frame t in [-1, 1] (3), its ``steady_difference``
    from frame t - k moved onto it by the camera's displacement rounded to whole pixels (1, /32:
    a few grey levels still count), the mask where t - k saw (1)."""
    out = []
    for t in times:
        k = pair_gap(cam, t)
        cur = frames[t]
        if k == 0:
            diff, valid = np.zeros(cur.shape[:2], np.float32), np.zeros(cur.shape[:2], bool)
        else:
            d = np.rint(cam[t] - cam[t - k]).astype(int)
            prev, valid = shift_whole(frames[t - k], -int(d[0]), -int(d[1]))
            diff = steady_difference(cur, prev, valid)
        out.append(np.concatenate([cur.astype(np.float32) / 127.5 - 1, diff[..., None] / 32,
                                   valid[..., None].astype(np.float32)], -1).transpose(2, 0, 1))
    return np.stack(out).astype(np.float32)


@dataclass(frozen=True)
class MotionC2STConfig:
    widths: tuple[int, ...] = (16, 32, 32, 48)  # channels per conv; every one after the first halves H, W
    epochs: int = 16
    batch: int = 32
    lr: float = 2e-3  # Adam, cosine decay to 0
    seed: int = 0
    repeats: int = 1  # classifiers per fold (consecutive seeds), their accuracies averaged

    def __post_init__(self) -> None:
        if (
            not self.widths or min(self.widths) < 1 or self.epochs < 1 or self.batch < 2
            or self.lr <= 0 or self.repeats < 1
        ):
            raise ValueError(f"bad MotionC2STConfig: {self}")


class PairClassifier(nn.Module):
    """A ``motion_pairs`` sample -> one logit: convolutions (the first at full resolution, then
    stride 2) with ReLU, each channel's mean and maximum over the frame, a linear head."""

    def __init__(self, widths: tuple[int, ...], c_in: int = 5):
        super().__init__()
        layers: list[nn.Module] = []
        for i, w in enumerate(widths):
            layers += [nn.Conv2d(c_in, w, 3, 1 if i == 0 else 2, 1), nn.ReLU()]
            c_in = w
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(2 * c_in, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x).flatten(2)  # (N, C, H'*W')
        return self.head(torch.cat([h.mean(2), h.amax(2)], 1))[:, 0]


def _augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    flips = [d for d in (2, 3) if bool(torch.rand((), generator=gen) < 0.5)]
    x = x.flip(flips) if flips else x
    return x.transpose(2, 3) if bool(torch.rand((), generator=gen) < 0.5) else x


def train_pair_classifier(x: torch.Tensor, y: torch.Tensor, cfg: MotionC2STConfig) -> PairClassifier:
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    net = PairClassifier(cfg.widths, x.shape[1])
    fit_binary(net, x, y, _augment, lr=cfg.lr, epochs=cfg.epochs, batch=cfg.batch, gen=gen)
    return net.eval()


def motion_c2st(a: np.ndarray, b: np.ndarray, groups_a: np.ndarray, groups_b: np.ndarray,
                cfg: MotionC2STConfig = MotionC2STConfig(), folds: int = 4) -> float:
    """Balanced held-out accuracy of classifiers telling ``motion_pairs`` samples ``a`` from
    ``b`` (each with its world id in ``groups_*``), cross-fitted over folds of worlds: 0.5 when
    they cannot be told apart, 1.0 when they always can."""
    if a.shape[1:] != b.shape[1:] or len(groups_a) != len(a) or len(groups_b) != len(b):
        raise ValueError(f"pair sets {a.shape} / {b.shape} with {len(groups_a)} / {len(groups_b)} groups")
    fold = torch.from_numpy(world_folds(np.concatenate([groups_a, groups_b]), folds))
    x = torch.from_numpy(np.concatenate([a, b]))
    y = torch.cat([torch.zeros(len(a)), torch.ones(len(b))])
    right = torch.zeros(cfg.repeats, len(x), dtype=torch.bool)
    for k in range(folds):
        test = fold == k
        for r in range(cfg.repeats):
            net = train_pair_classifier(x[~test], y[~test], replace(cfg, seed=cfg.seed + r))
            with torch.no_grad():
                xt = x[test]
                pred = torch.cat([net(xt[s : s + 256]) for s in range(0, len(xt), 256)]) > 0
            right[r, test] = pred == (y[test] > 0.5)
    acc = (right[:, y < 0.5].float().mean(1) + right[:, y > 0.5].float().mean(1)) / 2
    return float(acc.mean())
