"""Quality of the world model against the procedural world's renderer, on held-out worlds.

    python -m bench.quality [--quick] [--weights PATH] [--out DIR | --update-docs] [--steps N] [--eta E]
                            [--oracle frame|ground[:EVERY] ...] [--oracle-every N]

For every bucket: the model is anchored on the renderer's first frame (an observation), then driven
by held-out action scripts; its rollout is compared with the renderer's for the same actions:

- PSNR at horizons 1, 8, 32 beside the repeat-the-last-frame baseline, each from the mean
  squared error over all episodes (``pooled_psnr``), and beside two references that know
  the commanded camera shift exactly (``shift_oracle``): the first frame moved, with the
  area it never showed filled by its mean colour (``oracle_mean``, what averaging the
  unknown earns) or by real content of the same scene from elsewhere (``oracle_sharp``,
  what drawing plausible new terrain earns); at h8 and h32 also split by region: where the
  first frame's content only has to be carried along (``known``) and where new content has
  to be made up (``unseen``), and the model's known region once more after moving its frame by
  the integer offset (within ±2 px) that fits best (``known_aligned``: near ``known_model``
  when what the model loses there is detail, not position);
- the same per episode, with the episode's scene (printed after the bucket's numbers);
- the same with the camera held still (only the world's own motion), where repeat-last is
  nearly right: a model that drifts when nothing is asked shows here;
- action control, on 24 episodes of their own (``--quick`` too): share of moving steps where the
  model's global motion between consecutive frames matches the commanded shift, beside the
  renderer's own score, the model's share over the steps where the renderer's own frames pass
  (``control_acc_judged``), and both per weather; per PSNR episode too. The motion is
  measured by phase correlation of median-filtered frames, band-limited (``motion_ok``): plain
  phase correlation follows falling snow or rain rather than the ground
  (``control_acc_renderer_plain``: the renderer's frames scored by it);
- scene control: after a mid-rollout prompt switch, the frames' mean colour moves toward the new
  scene's (closer to the renderer's new-scene frames than to the old-scene ones) within 4 frames;
- revisit (``bench._revisit``): 2 s of steering, 3 s away and back along the same path; the view
  at the return against the view shown there before, for the model (``revisit_psnr``) and for
  the renderer, whose animals, water and weather move (``revisit_psnr_world``);
- long-rollout health (5,000 frames; 1,000 with --quick): finite, contrast within [0.7, 1.5]x the
  renderer's, changing while moving and still while idle;
- sharpness late in the long rollout: mean gradient magnitude over the last fifth of the
  rollout divided by the renderer's over the same frames; beside it two measures of whether
  that content looks like the world, which gradient magnitude alone cannot tell (streaks
  count as edges): ``colour_late``, the histogram intersection (1: the same colours) of the
  model's late frames with the renderer's late frames of the same episode (beside
  ``colour_late_renderer``: the renderer's late frames against its own first fifth, the
  spread one scene has from place to place), ``anisotropy_late`` (model, renderer), how much
  more the gradients run along one axis than the other (0 for isotropic ground, toward 1
  for stripes), and ``seams_late`` (model, renderer), the mean gradient across the token
  grid's lines over the mean gradient elsewhere (near 1 for the world; above it where
  every token is drawn as a flat block of its own), and ``texture_late``, the distance of the
  late frames' feature statistics from the renderer's at the same moments (training's texture
  term, ``training/texture.py``; 0: made of the same; beside ``texture_late_renderer``, the
  renderer's late frames against its own from the first fifth).

What a person sees, at 2, 10 and 60 s of steering (``bench.realism``, smallest bucket; 32
held-out worlds of its own, 16 with ``--quick``): a classifier two-sample test per moment
(``c2st_<moment>``, 0.5: the model's frames cannot be told from the renderer's) with its
controls (``c2st_control``: the renderer against its 4x blur, ``c2st_blocks``: against its
16x16 block means; both must reach 0.95 or the run is VOID; ``c2st_null``: the renderer against
itself elsewhere, near 0.5), the Frechet distance in a scene-attribute network's features
(``fd_<moment>``) beside the renderer's own (``fd_floor``), and patch realism
(``patch_ratio_<moment>``, 1.0: made of the world's materials). ``--weights`` other than the
committed ones are measured there beside the committed weights (``--beside``), on the same worlds.
``--canvas`` adds the weights served on the world canvas (realism, and its revisit on its own line,
``canvas revisit_psnr=..``, and its steering, ``canvas control_acc=.. scene_ok=..``, on the worlds
and scripts of the weights' own), and each of the weights beside them on it (``canvas <name>``).
``--oracle frame|ground|tokens`` measures the weights there once more with their anchor reference
taken from the renderer (``bench._oracle``; ``ground:1``: the ground view every frame, as a canvas
would give it), each on a line ``oracle ... go_on=0|1`` above the summary.

Writes sample strips (renderer row above model row) as PNG under ``--out`` (default
``runs/quality``; ``--update-docs``: ``docs/quality``, the strips the docs show): ``strip_<bucket>``
for the first 32 frames, ``long_<bucket>`` for the long rollout at eight moments,
``realism_<moment>_<bucket>`` per moment of ``bench.realism``, ``revisit_<bucket>`` (per
episode: renderer at departure and return, model at departure and return). Last line
(smallest bucket): ``quality psnr_h8=.. psnr_h8_repeat=.. psnr_h32=.. psnr_h32_repeat=..
control_acc=.. sharpness_late=.. c2st_2s=.. c2st_10s=.. c2st_60s=.. c2st_control=.. c2st_blocks=..
fd_60s=.. fd_floor=.. patch_ratio_60s=.. revisit_psnr=.. revisit_psnr_world=.. scene_ok=0|1
long_ok=0|1``, with ``VOID`` at its end when a control of the two-sample test failed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from worldserve.bench import realism
from worldserve.bench._control import CONTROL_EPISODES, control_steps, steering, steering_line
from worldserve.bench._driver import Driver, Rollouts, make_worlds, rollouts
from worldserve.bench._frame_measures import (
    COLOUR_BINS,
    anisotropy,
    colour_hist,
    contrast,
    hist_intersection,
    mse,
    pooled_psnr,
    psnr_of_mse,
    seams,
    sharpness,
    texture_distance,
    texture_stats,
)
from worldserve.bench._revisit import revisit, revisit_line, save_revisit_strip
from worldserve.model.default.runner import ModelRunner
from worldserve.model.default.weights import DEFAULT_WEIGHTS
from worldserve.model.dtype import DTYPES, pick_dtype
from worldserve.session.plan import ACTION_DIM
from worldserve.world import expected_shift, mixed_policy

HORIZONS = (1, 8, 32)


def shifted(frame: np.ndarray, dy: float, dx: float) -> np.ndarray:
    """``frame`` (H, W, 3) moved by (dy, dx) pixels, bilinear, as float; NaN where the
    source lies outside the frame (content the first frame never showed)."""
    h, w, _ = frame.shape
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float64)
    sy, sx = ys - dy, xs - dx
    y0, x0 = np.floor(sy).astype(int), np.floor(sx).astype(int)
    fy, fx = (sy - y0)[..., None], (sx - x0)[..., None]
    f = frame.astype(np.float64)
    at = lambda oy, ox: f[np.clip(y0 + oy, 0, h - 1), np.clip(x0 + ox, 0, w - 1)]  # noqa: E731
    out = (at(0, 0) * (1 - fy) * (1 - fx) + at(1, 0) * fy * (1 - fx)
           + at(0, 1) * (1 - fy) * fx + at(1, 1) * fy * fx)
    out[(sy < 0) | (sy > h - 1) | (sx < 0) | (sx > w - 1)] = np.nan
    return out


def camera_shift(actions: np.ndarray, horizon: int, bucket: int) -> tuple[float, float]:
    """The static scene's total pixel shift over frames 1..``horizon`` of ``actions`` (T, A)."""
    dy, dx = np.sum([expected_shift(a, bucket) for a in actions[1 : horizon + 1]], axis=0)
    return float(dy), float(dx)


def region_psnr(roll: Rollouts, horizon: int, bucket: int) -> dict[str, float]:
    """The model's PSNR at ``horizon`` over the area the first frame already showed (moved
    by the commanded camera shift: content that only has to be carried along) and over the
    area it never showed (content that has to be made up), with repeat-last and the shift
    oracle beside it (the first frame moved; its mean colour where it showed nothing)."""
    keys = ("known_model", "known_aligned", "known_repeat", "known_oracle", "unseen_model", "unseen_repeat",
            "unseen_mean")
    sums = {k: 0.0 for k in keys}
    n_known = n_unseen = 0
    for i in range(roll.truth.shape[0]):
        moved = shifted(roll.truth[i, 0], *camera_shift(roll.actions[i], horizon, bucket))
        known = ~np.isnan(moved[..., 0])
        t = roll.truth[i, horizon].astype(np.float64)
        sums["known_oracle"] += float(((moved - t) ** 2).sum(-1)[known].sum())
        preds = {"model": roll.model[i, horizon], "repeat": roll.truth[i, 0]}
        for k, p in preds.items():
            sq = ((p.astype(np.float64) - t) ** 2).sum(-1)
            sums[f"known_{k}"] += float(sq[known].sum())
            sums[f"unseen_{k}"] += float(sq[~known].sum())
        sums["unseen_mean"] += float(((roll.truth[i, 0].reshape(-1, 3).mean(0) - t) ** 2).sum(-1)[~known].sum())
        sums["known_aligned"] += best_aligned(roll.model[i, horizon], t, known)
        n_known += int(known.sum())
        n_unseen += int((~known).sum())
    out = {}
    for k, v in sums.items():
        n = n_known if k.startswith("known") else n_unseen
        out[f"psnr_h{horizon}_{k}"] = psnr_of_mse(v / (3 * n)) if n else float("nan")
    return out


def best_aligned(pred: np.ndarray, truth: np.ndarray, region: np.ndarray, reach: int = 2) -> float:
    """Summed squared error of ``pred`` against ``truth`` (H, W, 3) over ``region`` (H, W)
    after moving ``pred`` by the integer offset within ±``reach`` px that fits best (pixels
    the move brings in from outside the frame keep their unmoved error)."""
    p, t = pred.astype(np.float64), truth.astype(np.float64)
    h, w = region.shape
    best = float(((p - t) ** 2).sum(-1)[region].sum())
    for dy in range(-reach, reach + 1):
        for dx in range(-reach, reach + 1):
            moved = np.roll(p, (dy, dx), (0, 1))
            inside = np.zeros((h, w), bool)
            inside[max(0, dy): h + min(0, dy), max(0, dx): w + min(0, dx)] = True
            err = ((np.where(inside[..., None], moved, p) - t) ** 2).sum(-1)
            best = min(best, float(err[region].sum()))
    return best


def shift_oracle(truth: np.ndarray, actions: np.ndarray, horizon: int, bucket: int, sharp: bool) -> np.ndarray:
    """A reference for the PSNR table: the first frame moved by the camera shift the actions
    command (exact, unlike any model), the area it never showed filled with its mean colour
    (the best guess under squared error) or, ``sharp``, with real content of the same frame
    from elsewhere (what a model that draws plausible new terrain gets). Actors and weather
    are left out. truth (E, T, H, W, 3), actions (E, T, A) -> (E, H, W, 3) at ``horizon``."""
    out = []
    for i in range(truth.shape[0]):
        m = shifted(truth[i, 0], *camera_shift(actions[i], horizon, bucket))
        fill = (np.roll(truth[i, horizon], (bucket // 2, bucket // 2), (0, 1)).astype(np.float64) if sharp
                else truth[i, 0].reshape(-1, 3).mean(0))
        out.append(np.where(np.isnan(m), fill, m))
    return np.stack(out)


def _db(err: float) -> str:
    return f"{psnr_of_mse(err):5.1f}" if err > 0 else "  inf"


def episode_lines(
    roll: Rollouts, horizons: tuple[int, ...] = (1, 8, 32), control: list[list[bool]] | None = None,
) -> list[str]:
    """One line per episode: its scene, whether the camera moved, PSNR model / repeat-last
    at each horizon (a static view makes repeat-last exact: printed as inf) and, given
    ``control`` (``control_steps``), the model's moving steps that followed the action."""
    lines = []
    for i in range(roll.truth.shape[0]):
        moved = bool(np.any([np.any(expected_shift(a, roll.truth.shape[2])) for a in roll.actions[i, 1:]]))
        cols = []
        for h in horizons:
            m, r = mse(roll.model[i, h], roll.truth[i, h]), mse(roll.truth[i, 0], roll.truth[i, h])
            cols.append(f"h{h} {_db(m)} / {_db(r)}")
        if control is not None and control[i]:
            cols.append(f"control {sum(control[i])}/{len(control[i])}")
        scene = roll.scenes[i] if roll.scenes else "?"
        lines.append(f"  ep{i:<2} {scene[:40]:<40} {'moving' if moved else 'still '}  " + "  ".join(cols))
    return lines


def short_rollouts(runner: ModelRunner, bucket: int, episodes: int, length: int, rng: np.random.Generator) -> Rollouts:
    worlds = make_worlds(episodes, bucket, rng, 0)
    actions = np.stack([mixed_policy(length, rng) for _ in worlds]).astype(np.float32)
    return rollouts(runner, bucket, worlds, actions, seed=1)


def still_rollouts(runner: ModelRunner, bucket: int, episodes: int, length: int, rng: np.random.Generator) -> Rollouts:
    """The camera held still: only actors, water and weather move. Repeating the last
    frame is nearly right here, so this shows a model that drifts when nothing is asked."""
    worlds = make_worlds(episodes, bucket, rng, 300)
    return rollouts(runner, bucket, worlds, np.zeros((episodes, length, ACTION_DIM), np.float32), seed=4)


def long_rollout(
    runner: ModelRunner, bucket: int, episodes: int, length: int, rng: np.random.Generator,
    strip: list[tuple[np.ndarray, np.ndarray]] | None = None, lines: list[str] | None = None,
) -> dict[str, float]:
    """Move 200 frames, idle 50, repeat; compare health and sharpness with the renderer.
    ``strip``, if given, receives (renderer, model) frames of every episode at eight
    evenly spaced moments; ``lines`` each episode's scene and mean contrast, model and
    renderer (which episodes the pooled contrast ratio loses)."""
    worlds = make_worlds(episodes, bucket, rng, 200)
    drv = Driver(runner, bucket)
    drv.open(np.stack([w.render(bucket) for w in worlds]), [w.scene.to_prompt() for w in worlds], seed=3)
    policy = mixed_policy(length, rng).astype(np.float32)
    moving = np.ones(length, bool)
    for t in range(length):
        if t % 250 >= 200:
            policy[t] = 0.0
            moving[t] = False
    late = int(length * 0.8)
    m_con, r_con, m_sharp, r_sharp = [], [], [], []
    m_aniso, r_aniso, m_seams, r_seams = [], [], [], []
    m_hist, r_hist, r_early = (np.zeros((episodes, COLOUR_BINS**3)) for _ in range(3))
    m_tex, r_tex, early_tex = [], [], []
    patch = runner.cfg.patch  # the token grid in pixels, every bucket
    diff_move, diff_idle = [], []
    finite = True
    prev = None
    for t in range(1, length):
        frames = drv.step(np.repeat(policy[t][None], episodes, 0))
        for w in worlds:
            w.step(policy[t])
        snap = strip is not None and t % max(1, length // 8) == 0
        if t % 10 == 0 or t >= late or snap:
            truth = [w.render(bucket) for w in worlds]
            if snap:
                strip.append((np.stack(truth), frames.copy()))
            m_con.append([contrast(f) for f in frames])
            r_con.append([contrast(f) for f in truth])
            if t >= late:
                m_sharp.append(np.mean([sharpness(f) for f in frames]))
                r_sharp.append(np.mean([sharpness(f) for f in truth]))
                m_aniso.append(np.mean([anisotropy(f) for f in frames]))
                r_aniso.append(np.mean([anisotropy(f) for f in truth]))
                m_seams.append(np.mean([seams(f, patch) for f in frames]))
                r_seams.append(np.mean([seams(f, patch) for f in truth]))
                for i, (f, r) in enumerate(zip(frames, truth, strict=True)):
                    m_hist[i] += colour_hist(f)
                    r_hist[i] += colour_hist(r)
                truth_tex = texture_stats(np.stack(truth))
                m_tex.append(texture_distance(texture_stats(frames), truth_tex))
                r_tex.append(texture_distance(truth_tex, early_tex[len(r_tex) % len(early_tex)]))
            elif t < length // 5:
                for i, r in enumerate(truth):
                    r_early[i] += colour_hist(r)
                early_tex.append(texture_stats(np.stack(truth)))
        if prev is not None:
            d = float(np.abs(frames.astype(np.int16) - prev.astype(np.int16)).mean())
            (diff_move if moving[t] else diff_idle).append(d)
        prev = frames
    for sid in drv.ids:
        finite &= bool(torch.isfinite(runner.sessions[sid].prev).all())
    drv.close()
    ratio = float(np.mean(m_con) / max(np.mean(r_con), 1e-6))
    if lines is not None:
        by_ep = np.mean(m_con, 0), np.mean(r_con, 0)
        lines += [f"  ep{i:<2} {w.scene.to_prompt()[:40]:<40} contrast model / renderer {m:5.1f} / {r:5.1f}"
                  for i, (w, m, r) in enumerate(zip(worlds, *by_ep, strict=True))]
    return {
        "finite": float(finite),
        "contrast_ratio": ratio,
        "contrast_min_ratio": float(np.min(np.mean(m_con, 1) / np.maximum(np.mean(r_con, 1), 1e-6))),
        "moving_diff": float(np.mean(diff_move)),
        "idle_diff": float(np.mean(diff_idle)) if diff_idle else 0.0,
        "sharpness_late": float(np.mean(m_sharp) / max(np.mean(r_sharp), 1e-6)),
        "colour_late": float(np.mean([hist_intersection(m, r) for m, r in zip(m_hist, r_hist, strict=True)])),
        "colour_late_renderer": float(np.mean([hist_intersection(e, r) for e, r in zip(r_early, r_hist, strict=True)])),
        "anisotropy_late": float(np.mean(m_aniso)),
        "anisotropy_late_renderer": float(np.mean(r_aniso)),
        "seams_late": float(np.mean(m_seams)),
        "seams_late_renderer": float(np.mean(r_seams)),
        "texture_late": float(np.mean(m_tex)),
        "texture_late_renderer": float(np.mean(r_tex)),
    }


def save_strips(roll: Rollouts, out: Path, bucket: int, n: int = 3,
                frames: tuple[int, ...] = (0, 1, 4, 8, 16, 24, 31)) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(min(n, roll.truth.shape[0])):
        rows.append(np.concatenate([roll.truth[i, t] for t in frames], 1))
        rows.append(np.concatenate([roll.model[i, t] for t in frames], 1))
    img = np.concatenate(rows, 0)
    scale = max(1, 128 // bucket)
    big = Image.fromarray(img).resize((img.shape[1] * scale, img.shape[0] * scale), Image.NEAREST)
    big.save(out / f"strip_{bucket}.png")


def save_long_strip(frames: list[tuple[np.ndarray, np.ndarray]], out: Path, bucket: int) -> None:
    """The long rollout at eight moments, left to right: per episode a renderer row above a
    model row (``long_<bucket>.png``)."""
    if not frames:
        return
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(frames[0][0].shape[0]):
        rows.append(np.concatenate([truth[i] for truth, _ in frames], 1))
        rows.append(np.concatenate([model[i] for _, model in frames], 1))
    img = np.concatenate(rows, 0)
    scale = max(1, 128 // bucket)
    big = Image.fromarray(img).resize((img.shape[1] * scale, img.shape[0] * scale), Image.NEAREST)
    big.save(out / f"long_{bucket}.png")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Model rollouts against the renderer on held-out worlds.")
    ap.add_argument("--quick", action="store_true", help="fewer episodes and a 1,000-frame long rollout")
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--beside", type=Path, nargs="*", default=None,
                    help="weights the realism measures take beside --weights on the same worlds "
                         "(default: the committed weights, when --weights names others)")
    realism.add_out_args(ap)
    realism.add_oracle_args(ap)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--dtype", default="float32", choices=DTYPES, help="the model's float type")
    ap.add_argument("--buckets", type=int, nargs="+", default=None, help="only these buckets (default: all)")
    ap.add_argument("--steps", type=int, default=None,
                    help="denoising steps per frame (noise levels 1, (n-1)/n, ..., 1/n); default the model's")
    ap.add_argument("--eta", type=float, default=None,
                    help="share of fresh noise between steps (1: all fresh, 0: the Euler step); default the weights'")
    args = ap.parse_args(argv)
    out = realism.out_dir(args)
    torch.set_num_threads(args.threads)
    sampler = {} if args.eta is None else {"sampler_eta": args.eta}
    if args.steps is not None:  # any count: levels 1, ..., 1/n (training draws levels uniformly too)
        if args.steps < 1:
            ap.error("--steps must be at least 1")
        sampler["denoising_steps"] = args.steps
    runner = ModelRunner.from_pretrained(args.weights, max_sessions=32, dtype=pick_dtype(args.dtype),
                                         sampler=sampler)
    Driver.steps = args.steps
    episodes = 4 if args.quick else 12
    long_len = 1000 if args.quick else 5000
    summary: dict[str, float] = {}
    asked = sorted(args.buckets or runner.buckets)
    for bucket in asked:
        t0 = time.perf_counter()
        rng = np.random.default_rng([args.seed, bucket])
        roll = short_rollouts(runner, bucket, episodes, max(HORIZONS) + 1, rng)
        save_strips(roll, out, bucket)
        res = {}
        for h in HORIZONS:
            res[f"psnr_h{h}"] = pooled_psnr(roll.model[:, h], roll.truth[:, h])
            res[f"psnr_h{h}_repeat"] = pooled_psnr(roll.truth[:, 0], roll.truth[:, h])
            for kind, sharp in (("mean", False), ("sharp", True)):
                ref = shift_oracle(roll.truth, roll.actions, h, bucket, sharp)
                res[f"psnr_h{h}_oracle_{kind}"] = pooled_psnr(ref, roll.truth[:, h])
            if h > 1:
                res.update(region_psnr(roll, h, bucket))
        per_model, _ = control_steps(roll)
        steer, by_weather = steering(runner, bucket, episodes, max(HORIZONS) + 1, args.seed)
        still = still_rollouts(runner, bucket, episodes, max(HORIZONS) + 1,
                               np.random.default_rng([args.seed, bucket, 1]))
        for h in HORIZONS[1:]:
            res[f"still_psnr_h{h}"] = pooled_psnr(still.model[:, h], still.truth[:, h])
            res[f"still_psnr_h{h}_repeat"] = pooled_psnr(still.truth[:, 0], still.truth[:, h])
        res.update(steer)
        rv = revisit(runner, bucket, episodes, np.random.default_rng([args.seed, bucket, 3]))
        save_revisit_strip(rv, out, bucket)
        res["revisit_psnr"] = pooled_psnr(rv.back[:, 1], rv.left[:, 1])
        res["revisit_psnr_world"] = pooled_psnr(rv.back[:, 0], rv.left[:, 0])
        long_lines: list[str] = []
        if bucket == asked[0] or not args.quick:  # the summary's bucket always has a long rollout
            frames: list[tuple[np.ndarray, np.ndarray]] = []
            length = long_len if bucket == runner.buckets[0] else long_len // 5
            long = long_rollout(runner, bucket, min(episodes, 4), length, rng, frames, long_lines)
            save_long_strip(frames, out, bucket)
            res.update(long)
            res["long_ok"] = float(
                long["finite"] == 1.0 and 0.7 <= long["contrast_ratio"] <= 1.5
                and long["moving_diff"] > 2 * long["idle_diff"]
            )
        print(f"bucket {bucket} ({time.perf_counter() - t0:.0f} s)")
        for k, v in res.items():
            print(f"  {k:<22} {v:8.3f}")
        print(f"  control by weather, model / renderer over moving steps ({CONTROL_EPISODES} more episodes):")
        print("\n".join(f"    {w:<9} {m:5.3f} / {r:5.3f}  ({n} steps)" for w, (m, r, n) in by_weather.items()))
        print(f"  per episode, PSNR model / repeat-last (bucket {bucket}):")
        print("\n".join(episode_lines(roll, control=per_model)))
        if long_lines:
            print(f"  long rollout per episode (bucket {bucket}):")
            print("\n".join(long_lines))
        if not summary:  # the smallest bucket asked for
            summary = res
    paths = [args.weights, *realism.beside_weights(args.weights, args.beside)]
    labels = realism.label_weights(paths)
    kw = {"max_sessions": 32, "dtype": pick_dtype(args.dtype), "sampler": sampler}
    runners = {labels[0]: runner} | {
        label: ModelRunner.from_pretrained(p, **kw)  # type: ignore[arg-type]
        for label, p in zip(labels[1:], paths[1:], strict=True)
    }
    oracles = realism.with_oracles(runners, args.weights, realism.parse_oracles(ap, args), **kw)
    realism.with_canvas(runners, paths, args.canvas, **kw)
    lines: list[str] = []
    real = realism.measure(runners, asked[0], realism.worlds_for(args.quick), args.seed, out, lines=lines,
                           oracles=oracles)
    print("\n".join(lines))
    print("\n".join(realism.oracle_lines(real, oracles) + realism.canvas_lines(real)))
    if args.canvas:  # the canvas's own revisit, on the same script as the weights' above
        print(revisit_line(realism.CANVAS, runners[realism.CANVAS], asked[0], episodes, args.seed, out))
        print(steering_line(realism.CANVAS, runners[realism.CANVAS], asked[0], episodes, max(HORIZONS) + 1, args.seed))
    s, r = summary, real[labels[0]]
    print(
        f"quality psnr_h8={s['psnr_h8']:.2f} psnr_h8_repeat={s['psnr_h8_repeat']:.2f} "
        f"psnr_h32={s['psnr_h32']:.2f} psnr_h32_repeat={s['psnr_h32_repeat']:.2f} "
        f"control_acc={s['control_acc']:.3f} sharpness_late={s['sharpness_late']:.3f} "
        f"{realism.summary_fields(r)} revisit_psnr={s['revisit_psnr']:.2f} "
        f"revisit_psnr_world={s['revisit_psnr_world']:.2f} scene_ok={int(s['scene_ok'])} long_ok={int(s['long_ok'])}"
        + (" VOID" if r["void"] else "")
    )


if __name__ == "__main__":
    main()
