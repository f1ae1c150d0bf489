"""Does what moves in the world move in the model's picture? ``bench.realism``'s motion part.

    python -m bench.realism_motion [--worlds N] [--fresh] [--moments 2s,10s,60s] [--threads N]

Held-out worlds (``HELD_OUT_SEEDS[FIRST_WORLD:]``; ``--fresh``: ``FRESH_SEEDS``, a range no
bench, tokenizer, bank or training run has used, for the final confirmation only), each under a
random scene and a held-out steering script (``mixed_policy``). Every world is the one a
server's session of that seed and prompt starts in (``world.start``: a 256-unit map at the
seed's place), so the world's frames and the model's show the same places under the same keys.

Rows:

- ``world``: the renderer; ``frozen``: the same world with ``animate=False`` (only the camera
  moves), the control of every motion measure;
- ``canvas``: the served default (the weights on the world canvas), started as the server
  starts a session without an observation (``ModelRunner.first_frame``, its ground kept);
- ``canvas obs``: the same, started on a client's observation (the world's first frame,
  ``ready_observation`` then the open, as the server does);
- ``live`` (``--live``): the canvas with the live state of what moves (the server's
  ``--canvas-live``), started as the server starts it;
- ``passthrough`` / ``passthrough obs``: the canvas's reference of each frame (its colour channels
  in the transformer's input, ``ModelRunner._prev_inputs``) shown as the frame, no transformer:
  the baseline a model that draws must beat. Read from the same sessions as the two canvas rows.

At each moment (2, 10, 60 s) the frames t - 39 ... t + 16 are kept; the last 32 (t - 15 ...
t + 16, ``bench.realism``'s window) are judged:

- ``c2st``: ``bench.realism``'s single-frame two-sample test against the world's frames;
- actors (``bench.actor_detector``, ``bench._motion_measures``): detected actors per view per
  kind over the same views as the world's (the same places: matched water and land share by
  construction; the views' water share is printed beside), median track speed per kind (px a
  frame, the camera's shift taken out), and continuity: the share of 24 frames in view a
  tracked actor stays tracked;
- weather: cloud-shadow cover (worlds whose weather casts shadows), haze (fog worlds) and the
  drift speed of the shadow or fog field, each against the world's own ground at the place;
- ``c2st_motion``: the two-sample test on frame pairs (frame t, frame t - k moved by the
  camera onto it, their difference; k up to 24), against the world's pairs. Its control,
  ``motion_control``, is the world against ``frozen`` on the same pairs: where it reads below
  ``MOTION_CONTROL_GOAL`` the motion test is VOID at that moment and reported so.

Ratios are the row's figure over the world's. The last lines: ``realism <row> key=value ...``
per row.
"""

from __future__ import annotations

import argparse
import pickle
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from worldserve.bench import _motion_measures as mm
from worldserve.bench._frame_measures import psnr_of_mse
from worldserve.bench._realism_measures import C2STConfig, c2st_readings
from worldserve.bench._revisit import AWAY_FRAMES, LEAD_FRAMES, away_script, undo
from worldserve.bench.actor_detector import KIND_NAMES, KINDS, ActorNet, detect_all, load_detector
from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.runner import ModelRunner
from worldserve.model.dtype import DTYPES, pick_dtype
from worldserve.session.plan import Batch, ChunkWork, SessionSpec, StepPlan
from worldserve.training.train import HELD_OUT_SEEDS
from worldserve.world import World, mixed_policy, parse_prompt, sample_scene
from worldserve.world.start import START_MAP_SIZE

FPS = 24
MOMENTS: tuple[tuple[str, int], ...] = (("2s", 2 * FPS), ("10s", 10 * FPS), ("60s", 60 * FPS))
JUDGED = 32  # frames judged at a moment: t - 15 ... t + 16 (bench.realism's window)
LEAD = 24  # frames kept before them: pairs reach back up to 24 frames, tracks start there
FIRST_WORLD = 500  # HELD_OUT_SEEDS[500:]: bench.realism's worlds (as the server starts them here)
FRESH_SEEDS = range(7_000_000, 7_000_064)  # no bench, tokenizer, bank or training range comes near
MOTION_CONTROL_GOAL = 0.90  # the world against its frozen copy: below this the motion test is VOID
BUCKET = 64
SHADOW_WEATHERS = ("clear", "cloudy", "rain", "snowfall")  # atmosphere._CLOUDS: weathers with cloud shadows


@dataclass
class Run:
    """One row's frames at every moment: (E, LEAD + JUDGED, H, W, 3) each."""

    frames: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class Worlds:
    seeds: list[int]
    prompts: list[str]
    actions: np.ndarray  # (E, T, A)
    cam: np.ndarray  # (E, T, 2) the camera's place in px
    world: Run
    frozen: Run
    grounds: Run  # the world's ground alone at the same places
    water: dict[str, np.ndarray]  # moment -> (E, LEAD + JUDGED) water share of each view
    first: np.ndarray  # (E, H, W, 3) frame 0
    wind: np.ndarray  # (E, 2) px a frame


def moment_range(t: int) -> range:
    """The frames kept at moment ``t``."""
    return range(t - JUDGED // 2 + 1 - LEAD, t + JUDGED // 2 + 1)


def start_world(seed: int, prompt: str, animate: bool = True) -> World:
    """The world a server's session of ``seed`` and ``prompt`` starts in (``world.start``)."""
    w = World(seed, parse_prompt(prompt), (BUCKET,), map_size=START_MAP_SIZE, animate=animate)
    w.reset(w.random_position(np.random.default_rng(seed)))
    return w


def water_share(w: World) -> float:
    y, x = w.position
    idx = (np.arange(64) + 0.5 - 32)
    rows = np.floor(y + idx).astype(int) % w.map_size
    cols = np.floor(x + idx).astype(int) % w.map_size
    return float(w.layout.walk_water[np.ix_(rows, cols)].mean())


def steer_worlds(seeds: list[int], rng: np.random.Generator, moments: tuple[tuple[str, int], ...]) -> Worlds:
    prompts = [sample_scene(rng).to_prompt() for _ in seeds]
    length = moments[-1][1] + JUDGED // 2 + 1
    actions = np.stack([mixed_policy(length, rng) for _ in seeds]).astype(np.float32)
    cam = np.stack([mm.camera_px(a, BUCKET) for a in actions])
    n, span = len(seeds), LEAD + JUDGED
    shape = (n, span, BUCKET, BUCKET, 3)
    world, frozen, grounds = Run(), Run(), Run()
    water = {name: np.zeros((n, span)) for name, _ in moments}
    for run in (world, frozen, grounds):
        run.frames = {name: np.zeros(shape, np.uint8) for name, _ in moments}
    at = {t: (name, j) for name, m in moments for j, t in enumerate(moment_range(m))}
    first = np.zeros((n, BUCKET, BUCKET, 3), np.uint8)
    wind = np.zeros((n, 2))
    for i, (seed, prompt) in enumerate(zip(seeds, prompts, strict=True)):
        live, still = start_world(seed, prompt), start_world(seed, prompt, animate=False)
        first[i] = live.render(BUCKET)
        wind[i] = np.array(live.layout.wind) * BUCKET / 64
        for t in range(1, length):
            live.step(actions[i, t])
            still.step(actions[i, t])
            if t in at:
                name, j = at[t]
                world.frames[name][i, j] = live.render(BUCKET)
                frozen.frames[name][i, j] = still.render(BUCKET)
                grounds.frames[name][i, j] = live.render_ground(BUCKET)
                water[name][i, j] = water_share(live)
    return Worlds(seeds, prompts, actions, cam, world, frozen, grounds, water, first, wind)


def drive(runner: ModelRunner, w: Worlds, moments: tuple[tuple[str, int], ...], observe: bool) -> tuple[Run, Run]:
    """The served model through ``w``'s scripts, started as the server starts a session
    (``observe``: on the world's first frame as a client's observation); returns its frames and
    its canvas's reference colours (the passthrough)."""
    n, span = len(w.seeds), LEAD + JUDGED
    shape = (n, span, BUCKET, BUCKET, 3)
    served, passed = Run(), Run()
    for run in (served, passed):
        run.frames = {name: np.zeros(shape, np.uint8) for name, _ in moments}
    at = {t: (name, j) for name, m in moments for j, t in enumerate(moment_range(m))}
    refs: list[torch.Tensor] = []
    inner = runner._prev_inputs
    c = runner.cfg.channels

    def keep(states: list, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = inner(states, actions)  # ((B, F, prev_channels, H, W): the previous frame, then the reference, ...)
        refs.append(out[0][:, -1, c : 2 * c])  # the canvas's colours for the chunk's last frame
        return out

    runner._prev_inputs = keep  # type: ignore[method-assign]
    ids = open_sessions(runner, w.seeds, w.prompts, w.first, observe)
    try:
        for t in range(1, w.actions.shape[1]):
            refs.clear()
            frames = step_sessions(runner, ids, t - 1, w.actions[:, t])
            if t in at:
                name, j = at[t]
                served.frames[name][:, j] = frames
                passed.frames[name][:, j] = WorldModel.decode(refs[-1]).cpu().numpy()
    finally:
        runner._prev_inputs = inner  # type: ignore[method-assign]
        runner.execute(StepPlan(freed=ids))
    return served, passed


def open_sessions(runner: ModelRunner, seeds: list[int], prompts: list[str], first: np.ndarray,
                  observe: bool) -> list[str]:
    """Sessions opened as the server opens them: without an observation, on the runner's
    ``first_frame`` (checked to be the world's frame 0, ``first``); with ``observe``, on
    ``first`` as a client's observation (``ready_observation``, then the open). Their ids."""
    ids = [f"m{i}" for i in range(len(seeds))]
    specs = []
    for i, (sid, seed, prompt) in enumerate(zip(ids, seeds, prompts, strict=True)):
        if observe:
            runner.ready_observation(prompt, seed, BUCKET, first[i])
            frame = first[i]
        else:
            frame = runner.first_frame(prompt, seed, BUCKET)
            if frame is None or not np.array_equal(frame, first[i]):
                raise RuntimeError(f"the server's start frame of seed {seed} is not the world's frame 0")
        specs.append(SessionSpec(sid, BUCKET, seed, prompt, frame))
    runner.execute(StepPlan(new_sessions=specs))
    return ids


def step_sessions(runner: ModelRunner, ids: list[str], block: int, actions: np.ndarray) -> np.ndarray:
    """One frame of every session under ``actions`` (E, A): (E, H, W, 3)."""
    items = [ChunkWork(sid, block, actions[i][None]) for i, sid in enumerate(ids)]
    out = runner.execute(StepPlan(batches=[Batch(BUCKET, runner.max_steps, items)]))
    if out.errors:
        raise RuntimeError(f"runner errors: {out.errors}")
    by_id = {r.session_id: r.frames[-1] for r in out.results}
    return np.stack([by_id[sid] for sid in ids])


# -- the two-sided revisit -------------------------------------------------------------------


def revisit(runner: ModelRunner, seeds: list[int], prompts: list[str], rng: np.random.Generator) -> dict[str, float]:
    """``bench._revisit``'s path (a lead, 3 s away, the same way back) from the server's start:
    PSNR of the view on return against the view on leaving, for the world and the served model,
    on the full frame and on the ground alone (pixels where the world shows anything over its
    ground, at either time, masked out with a 1 px margin: actors, glints, shadows, fog)."""
    worlds = [start_world(s, p) for s, p in zip(seeds, prompts, strict=True)]
    scripts = []
    for _ in worlds:
        away = away_script(rng)
        scripts.append(np.concatenate((mixed_policy(LEAD_FRAMES + 1, rng).astype(np.float32), away, undo(away))))
    actions = np.stack(scripts)
    leave, ret = LEAD_FRAMES, LEAD_FRAMES + 2 * AWAY_FRAMES
    first = np.stack([w.render(BUCKET) for w in worlds])
    ids = open_sessions(runner, seeds, prompts, first, observe=False)
    keep: dict[str, list[np.ndarray]] = {"world": [], "model": [], "over": []}
    try:
        for t in range(1, ret + 1):
            frames = step_sessions(runner, ids, t - 1, actions[:, t])
            for i, w in enumerate(worlds):
                w.step(actions[i, t])
            if t in (leave, ret):
                views = np.stack([w.render(BUCKET) for w in worlds])
                grounds = np.stack([w.render_ground(BUCKET) for w in worlds])
                keep["world"].append(views)
                keep["model"].append(frames)
                keep["over"].append(np.abs(views.astype(int) - grounds).max(-1) > 2)
    finally:
        runner.execute(StepPlan(freed=ids))
    over = torch.from_numpy((keep["over"][0] | keep["over"][1]).astype(np.float32))[:, None]
    ground = (F.max_pool2d(over, 3, 1, 1)[:, 0] < 0.5).numpy()[..., None]  # (E, H, W, 1)
    out = {}
    for k in ("world", "model"):
        a, b = (x.astype(np.float64) for x in keep[k])
        out[f"revisit_{k}"] = psnr_of_mse(float(((a - b) ** 2).mean()))
        out[f"revisit_ground_{k}"] = psnr_of_mse(float((((a - b) ** 2) * ground).sum() / max(ground.sum() * 3, 1)))
    out["ground_share"] = float(ground.mean())
    return out


# -- the measures of one row -------------------------------------------------------------------


def actor_stats(net: ActorNet, frames: np.ndarray, cam: np.ndarray, t0: int) -> dict[str, list[float]]:
    """Per kind name: counts per judged view, track speeds, continuities, and the judged views'
    water share (read by the detector); ``frames`` (span, ...) are the kept frames of one world at
    one moment starting at frame ``t0``."""
    dets, water = detect_all(net, frames)
    c = cam[t0 : t0 + len(frames)]
    tracks = mm.link_tracks(dets, c)
    speeds = mm.track_speeds(tracks)
    cont = mm.continuity(tracks, c, frames.shape[1], range(0, len(frames) - mm.CONTINUITY_SPAN + 1))
    out: dict[str, list[float]] = {"water": list(water[LEAD:])}
    for kind, name in zip(KINDS, KIND_NAMES, strict=True):
        out[f"count_{name}"] = [float((k == kind).sum()) for _, k in dets[LEAD:]]
        out[f"speed_{name}"] = speeds.get(kind, [])
        out[f"continuity_{name}"] = cont.get(kind, [])
    return out


def weather_stats(frames: np.ndarray, grounds: np.ndarray, cam: np.ndarray, t0: int, weather: str
                  ) -> dict[str, float]:
    judged = slice(LEAD, LEAD + JUDGED)
    fields = mm.weather_field(frames, grounds)
    out: dict[str, float] = {}
    if weather in SHADOW_WEATHERS:
        out["cloud"] = mm.cover(fields[judged])
    if weather == "fog":
        out["fog"] = mm.haze(frames[judged], grounds[judged])
    if weather in SHADOW_WEATHERS or weather == "fog":
        vy, vx, n = mm.drift(fields, cam[t0 : t0 + len(frames)], range(LEAD, LEAD + JUDGED, 4))
        out["drift"] = float(np.hypot(vy, vx)) if n else float("nan")
    return out


def pairs_of(frames: np.ndarray, cam: np.ndarray, t0: int) -> np.ndarray:
    return mm.motion_pairs(frames, cam[t0 : t0 + len(frames)], range(LEAD, LEAD + JUDGED))


def _median(x: list[float]) -> float:
    return float(np.median(x)) if x else float("nan")


def _ratio(a: float, b: float) -> float:
    return a / b if b and np.isfinite(a) and np.isfinite(b) else float("nan")


def measure(rows: dict[str, Run], w: Worlds, moments: tuple[tuple[str, int], ...], net: ActorNet,
            c2st: C2STConfig, motion: mm.MotionC2STConfig, log: list[str],
            motion_rows: tuple[str, ...] = ("canvas", "passthrough"),
            c2st_rows: tuple[str, ...] = ("frozen", "canvas", "passthrough", "canvas obs"), control: bool = True,
            ) -> dict[str, dict[str, float]]:
    """Every measure of every row against ``rows["world"]`` (the two-sample tests on ``c2st_rows``
    and ``motion_rows`` only: each costs minutes); returns row -> key -> figure."""
    n = len(w.seeds)
    weathers = [parse_prompt(p).weather for p in w.prompts]
    res: dict[str, dict[str, float]] = {r: {} for r in rows}
    pooled: dict[str, dict[str, list[float]]] = {r: {} for r in rows}
    groups = np.repeat(np.arange(n), JUDGED)
    for name, t in moments:
        t0 = moment_range(t)[0]
        truth = rows["world"].frames[name]
        pairs = {r: np.concatenate([pairs_of(rows[r].frames[name][i], w.cam[i], t0) for i in range(n)])
                 for r in rows if r in ("world", "frozen", *motion_rows)}
        controlled = name != "2s" and control
        ctrl = mm.motion_c2st(pairs["world"], pairs["frozen"], groups, groups, motion) if controlled else float("nan")
        log.append(f"  {name}: views' water share {w.water[name][:, LEAD:].mean():.2f} (the same places in every row); "
                   f"motion_control {ctrl:.3f}" + (" VOID" if ctrl < MOTION_CONTROL_GOAL else ""))
        for r, run in rows.items():
            frames = run.frames[name]
            acc = pooled[r]
            for i in range(n):
                for k, v in actor_stats(net, frames[i], w.cam[i], t0).items():
                    acc.setdefault(k, []).extend(v)
                    acc.setdefault(f"{k}_{name}", []).extend(v)
                for k, v in weather_stats(frames[i], w.grounds.frames[name][i], w.cam[i], t0, weathers[i]).items():
                    acc.setdefault(k, []).append(v)
                    acc.setdefault(f"{k}_{name}", []).append(v)
            if r in c2st_rows:
                judged = frames[:, LEAD:].reshape(-1, BUCKET, BUCKET, 3)
                res[r][f"c2st_{name}"] = float(c2st_readings(truth[:, LEAD:].reshape(-1, BUCKET, BUCKET, 3), judged,
                                                             groups, groups, c2st).mean())
                if name != "2s" and (r == "frozen" or r in motion_rows):  # the frozen row's is the control itself
                    res[r][f"c2st_motion_{name}"] = ctrl if r == "frozen" else mm.motion_c2st(
                        pairs["world"], pairs[r], groups, groups, motion)
                    res[r][f"motion_control_{name}"] = ctrl
    moving = [i for i in range(n) if weathers[i] in (*SHADOW_WEATHERS, "fog")]
    if moving:
        log.append(f"  the layouts' wind over the {len(moving)} worlds with shadows or fog: mean "
                   f"{np.hypot(*w.wind[moving].T).mean():.3f} px a frame (the drift's truth; weathers: "
                   f"{', '.join(weathers)})")
    for r in rows:
        acc, out = pooled[r], res[r]
        for suffix in ("", *(f"_{m}" for m, _ in moments)):
            water = np.array(acc.get(f"water{suffix}", [np.nan]))
            out[f"water{suffix}"] = float(water.mean())
            for kind in KIND_NAMES:
                counts = np.array(acc.get(f"count_{kind}{suffix}", [np.nan]))
                out[f"actors_{kind}{suffix}"] = float(counts.mean())
                # per view of one kind's ground: animals over the land share, boats over the water share
                share = water if kind == "boat" else 1 - water
                out[f"density_{kind}{suffix}"] = float(counts.sum() / max(share.sum(), 1e-9))
                out[f"speed_{kind}{suffix}"] = _median(acc.get(f"speed_{kind}{suffix}", []))
                out[f"continuity_{kind}{suffix}"] = float(np.mean(acc.get(f"continuity_{kind}{suffix}") or [np.nan]))
            out[f"actors{suffix}"] = sum(out[f"actors_{k}{suffix}"] for k in KIND_NAMES)
            out[f"density{suffix}"] = sum(out[f"density_{k}{suffix}"] for k in KIND_NAMES)
            speeds = [v for k in KIND_NAMES for v in acc.get(f"speed_{k}{suffix}", [])]
            conts = [v for k in KIND_NAMES for v in acc.get(f"continuity_{k}{suffix}", [])]
            out[f"speed{suffix}"] = _median(speeds)
            out[f"continuity{suffix}"] = float(np.mean(conts)) if conts else float("nan")
            for k in ("cloud", "fog", "drift"):
                vals = [v for v in acc.get(f"{k}{suffix}", []) if np.isfinite(v)]
                out[f"{k}{suffix}"] = float(np.mean(vals)) if vals else float("nan")
    world = res["world"]
    for r in rows:
        for key in ("actors", "density", "speed", "continuity", "cloud", "fog", "drift",
                    *(f"{a}_{k}" for a in ("actors", "density", "speed", "continuity") for k in KIND_NAMES)):
            res[r][f"{key}_ratio"] = _ratio(res[r][key], world[key])
    return res


def table(res: dict[str, dict[str, float]], moments: tuple[tuple[str, int], ...]) -> list[str]:
    """Per row and moment: c2st, motion c2st, water share read, animals per land view and boats
    per water view (``density``), median speeds (px a frame), continuity, cloud cover, haze, drift."""
    out = [f"  {'row':<16} {'moment':>6} {'c2st':>6} {'c2st_mo':>7} {'water':>5} {'anim/l':>6} {'boat/w':>6} "
           f"{'spd_an':>6} {'spd_bt':>6} {'cont_an':>7} {'cont_bt':>7} {'cloud':>6} {'haze':>6} {'drift':>6}"]
    for r, x in res.items():
        for name, _ in moments:
            out.append(f"  {r:<16} {name:>6} {x.get(f'c2st_{name}', np.nan):6.3f} "
                       f"{x.get(f'c2st_motion_{name}', np.nan):7.3f} "
                       f"{x[f'water_{name}']:5.2f} {x[f'density_animal_{name}']:6.2f} {x[f'density_boat_{name}']:6.2f} "
                       f"{x[f'speed_animal_{name}']:6.3f} {x[f'speed_boat_{name}']:6.3f} "
                       f"{x[f'continuity_animal_{name}']:7.3f} {x[f'continuity_boat_{name}']:7.3f} "
                       f"{x[f'cloud_{name}']:6.3f} {x[f'fog_{name}']:6.3f} {x[f'drift_{name}']:6.3f}")
    return out


SUMMARY = (  # key in the line <- key of the results (ratios: the row's over the world's)
    ("c2st_2s", "c2st_2s"), ("c2st_10s", "c2st_10s"), ("c2st_60s", "c2st_60s"),
    ("actors_ratio", "density_ratio"), ("actors_animal_ratio", "density_animal_ratio"),
    ("actors_boat_ratio", "density_boat_ratio"), ("speed_ratio", "speed_ratio"),
    ("speed_animal_ratio", "speed_animal_ratio"), ("speed_boat_ratio", "speed_boat_ratio"),
    ("continuity_ratio", "continuity_ratio"), ("cloud_ratio", "cloud_ratio"), ("fog_ratio", "fog_ratio"),
    ("drift_ratio", "drift_ratio"),
)


def summary_line(label: str, r: dict[str, float], passthrough: dict[str, float] | None) -> str:
    """``realism <label> key=value ...``: the issue's figures. ``actors_*ratio``: detected actors
    per view of their ground (animals per land share, boats per water share) over the world's;
    a motion c2st whose control read below ``MOTION_CONTROL_GOAL`` is VOID."""
    parts = [f"{k}={r.get(src, float('nan')):.3f}" for k, src in SUMMARY]
    if passthrough is not None:
        parts.append(f"passthrough_actors_ratio={passthrough.get('density_ratio', float('nan')):.3f}")
    for m in ("10s", "60s"):
        ctrl = r.get(f"motion_control_{m}", float("nan"))
        void = not ctrl >= MOTION_CONTROL_GOAL
        parts.append(f"c2st_motion_{m}={'VOID' if void else format(r.get(f'c2st_motion_{m}', float('nan')), '.3f')}")
        parts.append(f"motion_control_{m}={ctrl:.3f}")
    return f"realism {label} " + " ".join(parts)


def world_line(r: dict[str, float]) -> str:
    """The world's own figures (what the ratios divide by)."""
    keys = ["water", "density_animal", "density_boat", "actors_animal", "actors_boat", "speed_animal", "speed_boat",
            "continuity_animal", "continuity_boat", "cloud", "fog", "drift"]
    return "realism world " + " ".join(f"{k}={r[k]:.3f}" for k in keys)


def run_rows(seeds: list[int], moments: tuple[tuple[str, int], ...], args: argparse.Namespace
             ) -> tuple[Worlds, dict[str, Run], dict[str, float], list[str]]:
    """The world's, the frozen world's and the served model's frames (both starts, with their
    passthroughs), and the revisit."""
    t0 = time.perf_counter()
    w = steer_worlds(seeds, np.random.default_rng([args.seed, 59]), moments)
    log = [f"realism motion, bucket {BUCKET}: {len(seeds)} worlds (seeds {seeds[0]} ... {seeds[-1]}), moments "
           f"{','.join(n for n, _ in moments)}, renderer {time.perf_counter() - t0:.0f} s"]
    print(log[-1], flush=True)
    rows: dict[str, Run] = {"world": w.world, "frozen": w.frozen}
    runner = ModelRunner.from_pretrained(canvas=True, max_sessions=len(seeds), dtype=pick_dtype(args.dtype))
    for observe in (False, True) if not args.no_obs else (False,):
        t1 = time.perf_counter()
        served, passed = drive(runner, w, moments, observe)
        suffix = " obs" if observe else ""
        rows["canvas" + suffix], rows["passthrough" + suffix] = served, passed
        log.append(f"  canvas{suffix}: {w.actions.shape[1]} frames x {len(seeds)} worlds "
                   f"in {time.perf_counter() - t1:.0f} s")
        print(log[-1], flush=True)
    if args.live:  # the canvas with the live state of what moves (``--canvas-live``), started as served
        t1 = time.perf_counter()
        live = ModelRunner.from_pretrained(canvas=True, canvas_live=True, max_sessions=len(seeds),
                                           dtype=pick_dtype(args.dtype))
        rows["live"] = drive(live, w, moments, False)[0]
        log.append(f"  live: {w.actions.shape[1]} frames x {len(seeds)} worlds in {time.perf_counter() - t1:.0f} s")
        print(log[-1], flush=True)
    t1 = time.perf_counter()
    rv = revisit(runner, seeds, w.prompts, np.random.default_rng([args.seed, 3]))
    log.append(f"  revisit (served start, {LEAD_FRAMES} frames' lead, {AWAY_FRAMES} away and back) in "
               f"{time.perf_counter() - t1:.0f} s: full frame world {rv['revisit_world']:.2f} dB, canvas "
               f"{rv['revisit_model']:.2f} dB; ground alone ({rv['ground_share']:.2f} of the pixels) world "
               f"{rv['revisit_ground_world']:.2f} dB, canvas {rv['revisit_ground_model']:.2f} dB")
    print(log[-1], flush=True)
    return w, rows, rv, log


def pack(w: Worlds, rows: dict[str, Run], rv: dict[str, float], log: list[str]) -> dict[str, object]:
    """A run's rows as plain dicts and arrays (``--frames``: readable however the bench was started)."""
    worlds = {f.name: getattr(w, f.name) for f in fields(w)}
    for k in ("world", "frozen", "grounds"):
        worlds[k] = worlds[k].frames
    return {"worlds": worlds, "rows": {r: run.frames for r, run in rows.items()}, "revisit": rv, "log": log}


def unpack(d: dict) -> tuple[Worlds, dict[str, Run], dict[str, float], list[str]]:
    worlds = dict(d["worlds"])
    for k in ("world", "frozen", "grounds"):
        worlds[k] = Run(worlds[k])
    return Worlds(**worlds), {r: Run(f) for r, f in d["rows"].items()}, d["revisit"], d["log"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Motion realism of the served default: actors, weather, pairs.")
    ap.add_argument("--worlds", type=int, default=8)
    ap.add_argument("--fresh", action="store_true",
                    help="FRESH_SEEDS instead of HELD_OUT_SEEDS[FIRST_WORLD:] (once, at the end)")
    ap.add_argument("--moments", default="2s,10s,60s", help="of " + ",".join(n for n, _ in MOMENTS))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    ap.add_argument("--c2st-repeats", type=int, default=1, help="single-frame classifiers per fold")
    ap.add_argument("--c2st-epochs", type=int, default=C2STConfig.epochs,
                    help="single-frame classifier training passes")
    ap.add_argument("--c2st-rows", default="frozen,canvas,passthrough,canvas obs",
                    help="rows the single-frame two-sample test judges")
    ap.add_argument("--no-obs", action="store_true", help="skip the observation-start rows")
    ap.add_argument("--motion-rows", default="canvas,passthrough",
                    help="rows the motion two-sample test judges (minutes each; the control always runs)")
    ap.add_argument("--live", action="store_true",
                    help="a row for the canvas with the live state of what moves (the server's --canvas-live)")
    ap.add_argument("--no-tests", action="store_true",
                    help="no two-sample tests (actors, weather and revisit only: seconds, not minutes)")
    ap.add_argument("--frames", type=Path, default=None,
                    help="keep the rows' frames here (a pickle), or measure the ones kept there by an earlier run")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    wanted = args.moments.split(",")
    moments = tuple(m for m in MOMENTS if m[0] in wanted)
    if args.worlds < 4 or not moments:
        ap.error("--worlds >= 4 (four folds of worlds) and at least one moment")
    held_out = HELD_OUT_SEEDS[FIRST_WORLD : FIRST_WORLD + args.worlds]
    seeds = list(FRESH_SEEDS[: args.worlds]) if args.fresh else list(held_out)
    if args.frames is not None and args.frames.exists():  # the rows of an earlier run, measured again
        with args.frames.open("rb") as f:
            w, rows, rv, log = unpack(pickle.load(f))
    else:
        w, rows, rv, log = run_rows(seeds, moments, args)
        if args.frames is not None:
            with args.frames.open("wb") as f:
                pickle.dump(pack(w, rows, rv, log), f)
    t1 = time.perf_counter()
    res = measure(rows, w, moments, load_detector(),
                  replace(C2STConfig(), repeats=args.c2st_repeats, epochs=args.c2st_epochs), mm.MotionC2STConfig(), log,
                  () if args.no_tests else tuple(args.motion_rows.split(",")),
                  () if args.no_tests else tuple(args.c2st_rows.split(",")), control=not args.no_tests)
    log.append(f"  measures {time.perf_counter() - t1:.0f} s")
    log += table(res, moments)
    print("\n".join(log[1:]))
    print(world_line(res["world"]) + f" revisit_psnr={rv['revisit_world']:.2f} "
          f"revisit_ground_psnr={rv['revisit_ground_world']:.2f}")
    for r in rows:
        if r == "world":
            continue
        base = "passthrough" + (" obs" if r.endswith(" obs") else "")
        extra = ""
        if r == "canvas":
            extra = (f" revisit_psnr={rv['revisit_model']:.2f} revisit_ground_psnr={rv['revisit_ground_model']:.2f}"
                     f" revisit_over_world={rv['revisit_model'] - rv['revisit_world']:.2f}"
                     f" revisit_ground_vs_world={rv['revisit_ground_model'] - rv['revisit_ground_world']:.2f}")
        print(summary_line(r, res[r], res.get(base) if r.startswith(("canvas", "live")) else None) + extra)


if __name__ == "__main__":
    main()
