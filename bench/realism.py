"""Does the model's picture look like the world, seconds into steering? The part of
``bench.quality`` that measures what a person sees (it runs inside it; alone here).

    python -m bench.realism [--quick] [--weights PATH] [--beside PATH ...] [--out DIR | --update-docs]
                            [--oracle frame|ground[:EVERY] ...] [--oracle-every N]

Held-out worlds (``HELD_OUT_SEEDS[500:]``, worlds no other part of the bench uses; 32, or 16
with ``--quick``), each with a random scene and a held-out steering script (``mixed_policy``);
every model is anchored on the renderer's first frame and driven by the same script. At each
moment (2, 10 and 60 s at 24 fps: frames 48, 240, 1440) the frames t-15 ... t+16 of every
world, the renderer's and each model's, are compared three ways:

- ``c2st``: a classifier two-sample test (``bench._realism_measures``): small convolutional
  networks trained afresh (fixed seed) to tell the model's frames from the renderer's frames of
  the same places and prompts, their accuracy on worlds they did not train on (four folds of
  worlds, each judged by a network trained on the other three: no place is on both sides;
  ``--c2st-repeats`` networks a fold from consecutive seeds, default 3, their accuracies
  averaged, and the lowest and highest of them printed beside the mean (``classifiers``): one
  network's reading moves by up to 0.3 with its seed on the same frames at 10 s; twelve give
  a mean within about 0.03).
  0.5: indistinguishable; 1.0: always told apart. Beside it,
  the same recipe on the same counts of frames: ``c2st_control``, the renderer's frames at
  60 s against a 4x-blurred copy of them (4x4 averages, bilinearly enlarged), and
  ``c2st_blocks``, the same against their 16x16 block means (what a head that draws each token
  as one colour makes), which must both reach ``CONTROL_GOAL`` or the run is VOID (the test
  could not see); ``c2st_null``, the renderer's
  frames at 60 s against its own at 10 s (other places, same worlds and scenes), which should
  stay near 0.5 (the test does not see ghosts);
- ``fd``: the Frechet distance between the model's and the renderer's frames in the feature
  space of a network trained on renderer frames alone to name their scene attributes
  (``bench._scene_features``, cached in ``bench/data``); ``fd_floor``: the same distance
  between the renderer's frames at 60 s and its own at 10 s (two disjoint sets of the world's
  frames, same scenes: what a model earns that draws the world, only not the same places);
- ``patch_ratio``: the mean distance of every 8x8 patch of the model's frames (every 4th of
  the window) to its nearest patch (any place) among ``BANK_VIEWS`` renderer frames of the
  same world and scene at random places, over the same for the renderer's own frames at this
  moment. Patches are compared by what they are made of (mean colour, contrast per channel,
  edge strength: ``patch_descriptors``), not pixel by pixel, which rewards flat patches.
  1.0: made of the world's materials; a 16-pixel block in averaged colours finds no near
  patch in the world.

``--oracle frame|ground[:EVERY]`` adds the weights once more with their anchor reference taken
from the renderer (``bench._oracle``: every EVERY (default ``--oracle-every``) frames its view,
``frame`` as shown or ``ground`` the ground alone, moved by the exact camera shift), the ceiling of a model composing
on a perfect canvas; its line says ``go_on=1`` where c2st_60s <= ``GO_ON_C2ST`` and fd_60s <=
``GO_ON_FD`` x fd_floor.

Writes ``realism_<moment>_<bucket>.png`` under ``--out`` (default ``runs/quality``;
``--update-docs``: ``docs/quality``) per moment: the frame at the moment of
the first 8 worlds, the renderer's row above each model's row. Prints a table; the last line
is ``realism c2st_2s=.. c2st_10s=.. c2st_60s=.. c2st_control=.. c2st_blocks=.. fd_60s=..
fd_floor=.. patch_ratio_60s=.. c2st_null=..`` for ``--weights`` (with ``VOID`` at the end when the control
failed); above it, ``realism canvas c2st_2s=.. ..`` for each runner on the world canvas (the served model
with ``--canvas``). ``--weights`` other than the committed ones are measured with the committed weights
beside them (``--beside``), on the same worlds and scripts.

A single frame cannot show a frozen world: ``--motion`` adds ``bench.realism_motion`` (actor
statistics from a detector, moving weather, a two-sample test on frame pairs with its frozen
control, the canvas passed through, the server's start and the two-sided revisit) after the
lines above; its ``realism <row> ...`` lines come last.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from worldserve.bench._driver import Driver, make_worlds
from worldserve.bench._oracle import VIEWS, Oracle, OracleRunner
from worldserve.bench._realism_measures import (
    C2STConfig,
    blocky,
    blur4,
    c2st_accuracy,
    c2st_readings,
    frechet_distance,
    patch_distance,
)
from worldserve.bench._scene_features import DEFAULT_PATH as SCENE_NET_PATH
from worldserve.bench._scene_features import load_scene_net, scene_features
from worldserve.model.default.reference.canvas.ground import TRUST
from worldserve.model.default.reference.canvas.tile_decode import SHARPEN
from worldserve.model.default.runner import ModelRunner
from worldserve.model.default.weights import DEFAULT_WEIGHTS
from worldserve.model.dtype import DTYPES, pick_dtype
from worldserve.world import mixed_policy

FPS = 24
MOMENTS: tuple[tuple[str, int], ...] = (("2s", 2 * FPS), ("10s", 10 * FPS), ("60s", 60 * FPS))
WINDOW = 32  # frames per world at a moment: t - 15 ... t + 16
FIRST_WORLD = 500  # HELD_OUT_SEEDS[500:]: the other parts of bench.quality use 0 ... 423
CONTROL_GOAL = 0.95  # c2st_control below this: the run is VOID
PATCH_EVERY = 4  # patch realism: every 4th frame of a window
BANK_VIEWS = 48  # patch realism: each world's frames at random places, the patches to match
STRIP_WORLDS = 8
RUNS_OUT, DOCS_OUT = Path("runs/quality"), Path("docs/quality")  # strips: by default, and with --update-docs
CANVAS = "canvas"  # the label of the weights served with the world canvas
GO_ON_C2ST, GO_ON_FD = 0.80, 2.0  # the oracle's go-on rule: c2st_60s at most, fd_60s at most x fd_floor


@dataclass
class Moment:
    name: str
    frame: int  # the moment's frame index (the window is frame - 15 ... frame + 16)
    truth: np.ndarray  # (E, WINDOW, H, W, 3) the renderer's frames
    model: dict[str, np.ndarray]  # weights label -> (E, WINDOW, H, W, 3)

    @property
    def groups(self) -> np.ndarray:
        return np.repeat(np.arange(self.truth.shape[0]), self.truth.shape[1])  # each frame's world

    def flat(self, frames: np.ndarray) -> np.ndarray:
        return frames.reshape(-1, *frames.shape[2:])


def window(t: int, size: int = WINDOW) -> range:
    """The frames of the moment ``t``: t - size/2 + 1 ... t + size/2."""
    return range(t - size // 2 + 1, t + size // 2 + 1)


def window_frames(moments: list[Moment]) -> dict[int, tuple[Moment, int]]:
    """frame index -> (its moment, its place in the moment's window)."""
    return {t: (m, k) for m in moments for k, t in enumerate(window(m.frame, m.truth.shape[1]))}


@dataclass
class Steering:
    """The renderer's side of a run."""

    anchors: np.ndarray  # (E, H, W, 3) each world's first frame
    prompts: list[str]  # each world's scene
    actions: np.ndarray  # (E, T, A) the steering scripts
    moments: list[Moment]  # the renderer's windows, no model frames yet
    bank: np.ndarray  # (E, BANK_VIEWS, H, W, 3) each world's frames at random places, same scene
    # oracle label -> (E, T // every + 1, H, W, 3) the renderer's view for that oracle's
    # reference at frame t = k * every, its refreshes
    references: dict[str, np.ndarray] = field(default_factory=dict)


def steer_worlds(
    bucket: int, n: int, rng: np.random.Generator, moments: tuple[tuple[str, int], ...] = MOMENTS, size: int = WINDOW,
    oracles: tuple[Oracle, ...] = (),
) -> Steering:
    """``n`` held-out worlds steered by ``mixed_policy`` through the last moment's window of
    ``size`` frames, then seen at ``BANK_VIEWS`` random places (the bank of patch realism);
    on the way, the views each of ``oracles`` takes its references from."""
    if size < 2 or any(t - size // 2 + 1 < 1 for _, t in moments):
        raise ValueError(f"every moment's window of {size} frames must start after frame 0: {moments}")
    worlds = make_worlds(n, bucket, rng, FIRST_WORLD)
    length = window(moments[-1][1], size)[-1] + 1
    actions = np.stack([mixed_policy(length, rng) for _ in worlds]).astype(np.float32)
    anchors = np.stack([w.render(bucket) for w in worlds])
    steps = [Moment(name, t, np.zeros((n, size, bucket, bucket, 3), np.uint8), {}) for name, t in moments]
    at = window_frames(steps)
    refs = {o.label: np.zeros((n, length // o.every + 1, bucket, bucket, 3), np.uint8) for o in oracles}
    for i, w in enumerate(worlds):
        for t in range(1, length):
            w.step(actions[i, t])
            if t in at:
                m, k = at[t]
                m.truth[i, k] = w.render(bucket)
            for o in oracles:
                if o.due(t):
                    refs[o.label][i, t // o.every] = o.view_of(w, bucket)
    bank = np.zeros((n, BANK_VIEWS, bucket, bucket, 3), np.uint8)
    still = np.zeros(actions.shape[-1], np.float32)
    for i, w in enumerate(worlds):
        for k in range(BANK_VIEWS):
            w.reset(w.random_position(rng))
            for _ in range(int(rng.integers(0, 24))):  # weather and animals at another phase
                w.step(still)
            bank[i, k] = w.render(bucket)
    return Steering(anchors, [w.scene.to_prompt() for w in worlds], actions, steps, bank, refs)


def drive(runner: ModelRunner, bucket: int, anchors: np.ndarray, prompts: list[str], actions: np.ndarray,
          moments: list[Moment], label: str, oracle: Oracle | None = None,
          references: np.ndarray | None = None) -> None:
    """The model's side: anchored on ``anchors``, driven by ``actions``; its frames in each
    moment's window go into ``moment.model[label]``. With an ``oracle`` (``runner`` an
    ``OracleRunner``), each session's reference is refreshed from ``references`` (E, K, H, W, 3)
    where the oracle is due (``Steering.references``)."""
    if oracle is not None and (references is None or not isinstance(runner, OracleRunner)):
        raise ValueError(f"{oracle.label} needs an OracleRunner and the renderer's references")
    length = actions.shape[1]
    for m in moments:
        m.model[label] = np.zeros_like(m.truth)
    at = window_frames(moments)
    drv = Driver(runner, bucket)
    drv.open(anchors, prompts, seed=11)
    for t in range(1, length):
        frames = drv.step(actions[:, t])
        if t in at:
            m, k = at[t]
            m.model[label][:, k] = frames
        if oracle is not None and oracle.due(t):
            assert isinstance(runner, OracleRunner) and references is not None
            for i, sid in enumerate(drv.ids):
                runner.refresh(sid, references[i, t // oracle.every])
    drv.close()


def patch_ratio(m: Moment, bank: np.ndarray, label: str) -> tuple[float, list[float], list[float]]:
    """Patch realism of ``label``'s frames at moment ``m`` against ``bank`` (E, V, H, W, 3),
    each world's own frames elsewhere: (ratio, per world the model's mean nearest-patch
    distance, per world the renderer's own at the moment)."""
    d_model, d_truth = [], []
    for e in range(m.truth.shape[0]):
        d_model.append(patch_distance(m.model[label][e, ::PATCH_EVERY], bank[e]))
        d_truth.append(patch_distance(m.truth[e, ::PATCH_EVERY], bank[e]))
    return float(np.mean(d_model) / max(np.mean(d_truth), 1e-9)), d_model, d_truth


def save_moment_strips(moments: list[Moment], out: Path, bucket: int, n: int = STRIP_WORLDS) -> list[Path]:
    """Per moment, its frame in the first ``n`` worlds side by side: the renderer's row above
    each model's (``realism_<moment>_<bucket>.png``)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    scale = max(1, 128 // bucket)
    for m in moments:
        centre = m.truth.shape[1] // 2 - 1  # window index of the moment's own frame
        rows = [m.truth[:n, centre]] + [frames[:n, centre] for frames in m.model.values()]
        img = np.concatenate([np.concatenate(list(r), 1) for r in rows], 0)
        path = out / f"realism_{m.name}_{bucket}.png"
        Image.fromarray(img).resize((img.shape[1] * scale, img.shape[0] * scale), Image.NEAREST).save(path)
        paths.append(path)
    return paths


def measure(runners: dict[str, ModelRunner], bucket: int, worlds: int, seed: int, out: Path | None,
            c2st: C2STConfig | None = None, scene_net: Path = SCENE_NET_PATH, lines: list[str] | None = None,
            moments: tuple[tuple[str, int], ...] = MOMENTS, size: int = WINDOW,
            oracles: dict[str, Oracle] | None = None) -> dict[str, dict[str, float]]:
    """Every measure for every runner (label -> runner) on the same worlds and scripts;
    ``oracles`` names the labels whose runner (an ``OracleRunner``) takes its reference from
    the renderer, and how. Returns label -> {c2st_<moment>, fd_<moment>, patch_ratio_<moment>}
    plus the run's own c2st_control, c2st_blocks, c2st_null, fd_floor and void (1.0: a control
    failed) in every label's dict; ``lines`` receives the printed report."""
    log = lines if lines is not None else []
    c2st = c2st or C2STConfig()
    oracles = oracles or {}
    t0 = time.perf_counter()
    run = steer_worlds(bucket, worlds, np.random.default_rng([seed, bucket, 50]), moments, size,
                       tuple(oracles.values()))
    steps, prompts, actions = run.moments, run.prompts, run.actions
    log.append(f"realism, bucket {bucket}: {worlds} held-out worlds "
               f"(HELD_OUT_SEEDS[{FIRST_WORLD}:{FIRST_WORLD + worlds}]), "
               f"{size} frames a moment each, renderer {time.perf_counter() - t0:.0f} s")
    for label, runner in runners.items():
        t1 = time.perf_counter()
        oracle = oracles.get(label)
        drive(runner, bucket, run.anchors, prompts, actions, steps, label, oracle,
              None if oracle is None else run.references[oracle.label])
        log.append(f"  {label}: {actions.shape[1]} frames x {worlds} worlds in {time.perf_counter() - t1:.0f} s")
    if out is not None:
        log.append("  strips: " + " ".join(str(p) for p in save_moment_strips(steps, out, bucket)))

    t1 = time.perf_counter()
    last, middle = steps[-1], steps[len(steps) // 2]
    groups = last.groups
    truth_last = last.flat(last.truth)
    shared = {
        "c2st_control": c2st_accuracy(truth_last, blur4(truth_last), groups, groups, c2st),
        "c2st_blocks": c2st_accuracy(truth_last, blocky(truth_last), groups, groups, c2st),
        "c2st_null": c2st_accuracy(truth_last, middle.flat(middle.truth), groups, groups, c2st),
    }
    net = load_scene_net(scene_net)
    feats = {m.name: scene_features(net, m.flat(m.truth)) for m in steps}
    shared["fd_floor"] = frechet_distance(feats[last.name], feats[middle.name])
    shared["void"] = float(min(shared["c2st_control"], shared["c2st_blocks"]) < CONTROL_GOAL)
    log.append(f"  c2st_control {shared['c2st_control']:.3f} "
               f"(renderer at {last.name} vs its 4x blur; goal >= {CONTROL_GOAL})"
               f"   c2st_blocks {shared['c2st_blocks']:.3f} (vs its 16x16 block means; goal >= {CONTROL_GOAL})"
               f"   c2st_null {shared['c2st_null']:.3f} (renderer at {last.name} vs at {middle.name}; ~0.5)"
               f"   fd_floor {shared['fd_floor']:.2f} (the same pair)")
    if shared["void"]:
        log.append(f"  VOID: the two-sample test told the renderer from its 4x blur {shared['c2st_control']:.3f} "
                   f"and from its block means {shared['c2st_blocks']:.3f} of the time (< {CONTROL_GOAL}); "
                   "its c2st numbers mean nothing")
    res: dict[str, dict[str, float]] = {}
    log.append(f"  {'weights':<28} {'moment':>6} {'c2st':>6} {'classifiers':>11} {'fd':>8} {'patch_ratio':>11}")
    for label in runners:
        r = dict(shared)
        per_world: list[str] = []
        for m in steps:
            frames = m.flat(m.model[label])
            reads = c2st_readings(m.flat(m.truth), frames, m.groups, m.groups, c2st)
            r[f"c2st_{m.name}"] = float(reads.mean())
            r[f"fd_{m.name}"] = frechet_distance(scene_features(net, frames), feats[m.name])
            r[f"patch_ratio_{m.name}"], d_model, d_truth = patch_ratio(m, run.bank, label)
            spread = f"{reads.min():.2f}-{reads.max():.2f}"
            log.append(f"  {label[:28]:<28} {m.name:>6} {r[f'c2st_{m.name}']:6.3f} {spread:>11} "
                       f"{r[f'fd_{m.name}']:8.2f} {r[f'patch_ratio_{m.name}']:11.3f}")
            if m is last:
                per_world = [f"    w{e:<2} {prompts[e][:40]:<40} patch distance model / renderer {a:5.1f} / {b:5.1f}"
                             for e, (a, b) in enumerate(zip(d_model, d_truth, strict=True))]
        log.append(f"  per world at {last.name} ({label}):")
        log.extend(per_world)
        res[label] = r
    log.append(f"  measures {time.perf_counter() - t1:.0f} s")
    return res


def summary_fields(r: dict[str, float]) -> str:
    """The realism part of the summary line (``bench.quality``'s too)."""
    return (f"c2st_2s={r['c2st_2s']:.3f} c2st_10s={r['c2st_10s']:.3f} c2st_60s={r['c2st_60s']:.3f} "
            f"c2st_control={r['c2st_control']:.3f} c2st_blocks={r['c2st_blocks']:.3f} "
            f"fd_60s={r['fd_60s']:.2f} fd_floor={r['fd_floor']:.2f} "
            f"patch_ratio_60s={r['patch_ratio_60s']:.3f}")


def canvas_lines(res: dict[str, dict[str, float]]) -> list[str]:
    """``realism <label> c2st_2s=.. ..`` for each runner on the world canvas (the served model,
    and any weights or tokenizers measured on it), beside the summary line of ``--weights``."""
    return [f"realism {label} {summary_fields(r)}" + (" VOID" if r["void"] else "")
            for label, r in res.items() if label == CANVAS or label.startswith(f"{CANVAS} ")]


def label_weights(paths: list[Path]) -> list[str]:
    """Short names for weight files: the file name, or the path where two share a name."""
    names = [p.name for p in paths]
    return [p.name if names.count(p.name) == 1 else str(p) for p in paths]


def with_oracles(runners: dict[str, ModelRunner], weights: Path, oracles: list[Oracle],
                 **kw: object) -> dict[str, Oracle]:
    """Add an ``OracleRunner`` of ``weights`` to ``runners`` for each of ``oracles``; returns
    label -> ``Oracle`` for ``measure``."""
    for o in oracles:
        runners[o.label] = OracleRunner.from_pretrained(weights, **kw)  # type: ignore[arg-type]
    return {o.label: o for o in oracles}


def with_canvas(runners: dict[str, ModelRunner], paths: list[Path], on: bool, tokenizers: Sequence[Path] = (),
                trusts: Sequence[float] = (TRUST,), sharpens: Sequence[float] = (SHARPEN,), **kw: object) -> None:
    """Add each of ``paths`` served with the world canvas (``--canvas``) to ``runners``: the
    first as "canvas", the ones beside it as "canvas <label>" (``label_weights``), so a
    compositor trained on canvas references meets the committed one on the same canvas; the
    first again at each other reference trust of ``trusts`` (``--trust``; ``ModelConfig.
    reference_trust``; the served one is ``ground.TRUST``), as "canvas trust:<t>" (without the
    served trust in ``trusts``: those alone); likewise at each other unsharp amount of ``sharpens``
    (``--sharpen``; ``tile_decode.SHARPEN`` served), as "canvas sharpen:<s>"; then the
    first on the canvas of each of ``tokenizers`` (``--tokenizers``), as "canvas tok:<label>"."""
    if on:
        for i, (label, p) in enumerate(zip(label_weights(paths), paths, strict=True)):
            if i == 0 and (TRUST not in trusts or SHARPEN not in sharpens):
                continue
            runners[CANVAS if i == 0 else f"{CANVAS} {label}"] = ModelRunner.from_pretrained(
                p, canvas=True, **kw)  # type: ignore[arg-type]
        for t in dict.fromkeys(trusts):
            if t != TRUST:
                runners[f"{CANVAS} trust:{t:g}"] = ModelRunner.from_pretrained(
                    paths[0], canvas=True, canvas_trust=t, **kw)  # type: ignore[arg-type]
        for s in dict.fromkeys(sharpens):
            if s != SHARPEN:
                runners[f"{CANVAS} sharpen:{s:g}"] = ModelRunner.from_pretrained(
                    paths[0], canvas=True, canvas_sharpen=s, **kw)  # type: ignore[arg-type]
        for label, t in zip(label_weights([t.parent for t in tokenizers]), tokenizers, strict=True):
            runners[f"{CANVAS} tok:{label}"] = ModelRunner.from_pretrained(
                paths[0], canvas=True, tokenizer=t, **kw)  # type: ignore[arg-type]


def oracle_lines(res: dict[str, dict[str, float]], oracles: dict[str, Oracle]) -> list[str]:
    """One summary line per oracle, with the go-on rule's verdict."""
    out = []
    for label in oracles:
        r = res[label]
        ok = r["c2st_60s"] <= GO_ON_C2ST and r["fd_60s"] <= GO_ON_FD * r["fd_floor"]
        out.append(f"oracle {label} {summary_fields(r)} fd_60s/floor={r['fd_60s'] / r['fd_floor']:.2f} go_on={int(ok)}")
    return out


def add_out_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, default=None, help=f"where the strips go (default {RUNS_OUT})")
    ap.add_argument("--update-docs", action="store_true",
                    help=f"write the strips to {DOCS_OUT}, the ones the docs show")


def out_dir(args: argparse.Namespace) -> Path:
    """``--out``, else ``DOCS_OUT`` with ``--update-docs``, else ``RUNS_OUT``."""
    if args.out is not None and args.update_docs:
        raise SystemExit("--out and --update-docs are two answers to one question: give one")
    return args.out or (DOCS_OUT if args.update_docs else RUNS_OUT)


def add_oracle_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--oracle", nargs="+", default=[], metavar="VIEW[:EVERY]",
                    help=f"also measure the weights with their anchor reference taken from the renderer's view "
                         f"({'|'.join(VIEWS)}; frame: as shown; ground: the ground alone), refreshed every EVERY "
                         f"frames (default --oracle-every) and moved by the exact camera shift between")
    ap.add_argument("--oracle-every", type=int, default=8,
                    help="frames between the oracle reference's refreshes (1-16)")
    ap.add_argument("--canvas", action="store_true",
                    help="also measure the weights served with the world canvas as their reference "
                         "(model/default/reference/canvas/ground.py: the ground tokenizer and the prior's bank), "
                         "labelled canvas; "
                         "the weights beside them too, labelled 'canvas <name>'")


def parse_oracles(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[Oracle]:
    try:
        return [Oracle.parse(text, args.oracle_every) for text in args.oracle]
    except ValueError as exc:
        ap.error(str(exc))


def worlds_for(quick: bool) -> int:
    return 16 if quick else 32


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Two-sample test, Frechet distance and patch realism of model rollouts "
                                             "at 2, 10 and 60 s of steering, against the renderer.")
    ap.add_argument("--quick", action="store_true", help="16 worlds instead of 32 (the same moments and measures)")
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--beside", type=Path, nargs="*", default=None,
                    help="weights measured beside --weights on the same worlds (default: the committed weights, "
                         "when --weights names others)")
    add_out_args(ap)
    ap.add_argument("--bucket", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--dtype", default="float32", choices=DTYPES, help="the models' float type")
    ap.add_argument("--epochs", type=int, default=C2STConfig.epochs, help="two-sample classifier training passes")
    ap.add_argument("--c2st-repeats", type=int, default=C2STConfig.repeats,
                    help="two-sample classifiers per fold (consecutive seeds), their accuracies averaged")
    ap.add_argument("--scene-net", type=Path, default=SCENE_NET_PATH,
                    help="the cached scene-feature network (trained and written there when missing)")
    add_oracle_args(ap)
    ap.add_argument("--canvas-only", action="store_true",
                    help="measure the weights on the world canvas alone (with --canvas's labels); no anchor runs")
    ap.add_argument("--tokenizers", type=Path, nargs="*", default=[], metavar="TOKENIZER",
                    help="ground tokenizers (no suffix) to serve the canvas with beside the committed one "
                         "(a decoder trained on: the codes, and so the bank, must be the committed one's)")
    ap.add_argument("--trust", type=float, nargs="+", default=[TRUST], metavar="T",
                    help="the canvas at each reference trust T (ModelConfig.reference_trust: logits added to the "
                         f"head's reference mix; 0: as the weights learnt); the served {TRUST:g} is labelled canvas, "
                         "others 'canvas trust:T' (default: the served one alone)")
    ap.add_argument("--sharpen", type=float, nargs="+", default=[SHARPEN], metavar="S",
                    help="the canvas with each unsharp amount S on its decoded tiles (tile_decode.sharpen; 0: as "
                         f"the decoder draws); the served {SHARPEN:g} is labelled canvas, others 'canvas sharpen:S'")
    ap.add_argument("--motion", action="store_true",
                    help="then bench.realism_motion (what moves: actors, weather, frame pairs, the two starts, the "
                         "passthrough canvas, the two-sided revisit) on its own worlds; its summary lines come last")
    ap.add_argument("--motion-worlds", type=int, default=8, help="worlds of the --motion part")
    args = ap.parse_args(argv)
    if args.c2st_repeats < 1:
        ap.error(f"--c2st-repeats takes a count >= 1, got {args.c2st_repeats}")
    for name, vals in (("trust", args.trust), ("sharpen", args.sharpen)):
        if any(not 0 <= v < float("inf") for v in vals):
            ap.error(f"--{name} takes finite numbers >= 0, got {vals}")
    torch.set_num_threads(args.threads)
    paths = [args.weights, *beside_weights(args.weights, args.beside)]
    kw = {"max_sessions": worlds_for(args.quick), "dtype": pick_dtype(args.dtype)}
    runners = {} if args.canvas_only else {label: ModelRunner.from_pretrained(p, **kw)  # type: ignore[arg-type]
                                           for label, p in zip(label_weights(paths), paths, strict=True)}
    oracles = with_oracles(runners, args.weights, parse_oracles(ap, args), **kw)
    canvas = (args.canvas or args.canvas_only or bool(args.tokenizers)
              or args.trust != [TRUST] or args.sharpen != [SHARPEN])
    with_canvas(runners, paths, canvas, args.tokenizers, args.trust, args.sharpen, **kw)
    lines: list[str] = []
    c2st = replace(C2STConfig(), epochs=args.epochs, repeats=args.c2st_repeats)
    res = measure(runners, args.bucket, worlds_for(args.quick), args.seed, out_dir(args),
                  c2st, args.scene_net, lines, oracles=oracles)
    print("\n".join(lines))
    print("\n".join(oracle_lines(res, oracles) + canvas_lines(res)))
    r = res[next(iter(runners))]
    print(f"realism {summary_fields(r)} c2st_null={r['c2st_null']:.3f}" + (" VOID" if r["void"] else ""))
    if args.motion:
        from worldserve.bench import realism_motion

        realism_motion.main(["--worlds", str(args.motion_worlds), "--threads", str(args.threads),
                             "--dtype", args.dtype])


def beside_weights(weights: Path, beside: list[Path] | None) -> list[Path]:
    """What ``--beside`` asks for; by default the committed weights when ``weights`` are others."""
    if beside is not None:
        return [p for p in beside if p.resolve() != weights.resolve()]
    return [] if weights.resolve() == DEFAULT_WEIGHTS.resolve() else [DEFAULT_WEIGHTS]


if __name__ == "__main__":
    main()
