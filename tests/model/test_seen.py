"""The pixels an observation showed, kept on the canvas (model/default/reference/canvas/seen.py): a session
starts on the very frame it was given, the frame fades into the ground around it, and
snapshots, restores and scene changes carry or drop it as they should."""

from __future__ import annotations

import functools

import msgpack
import numpy as np
import torch

from tests.model.conftest import key_action, make_runner, run_chunks, tiny_config
from worldserve.model.default.reference.canvas import seen as seen_px
from worldserve.model.default.reference.canvas.canvas import TILE_UNITS
from worldserve.model.default.reference.canvas.ground import GroundPainter
from worldserve.session.plan import SessionSpec, StepPlan
from worldserve.session.session import Session, SessionConfig
from worldserve.session.snapshot import restore, snapshot
from worldserve.world import World
from worldserve.world.scene import SceneAttrs

BUCKET = 64
SCENE = "a green forest with a village by day"
SIDE = 16  # tiles per side of the serving torus


@functools.cache
def _painter() -> GroundPainter:
    return GroundPainter.load(torch.device("cpu"), ahead=False)


def _img(ref: torch.Tensor) -> np.ndarray:
    return (ref[:3].permute(1, 2, 0).numpy() + 1) * 127.5


def _world(seed: int = 5) -> World:
    world = World(seed, SCENE, (BUCKET,))
    world.reset((300.0, 300.0))
    return world


def test_feathered_weights_are_one_inside_and_fall_off_towards_every_edge() -> None:
    w = seen_px.feathered(64, 40, feather=8)
    assert w.shape == (64, 40)
    assert (w[8:-8, 8:-8] == 1).all()
    assert np.isclose(w[0, 20], 1 / 9) and np.isclose(w[-1, 20], 1 / 9) and np.isclose(w[30, 0], 1 / 9)
    assert (np.diff(w[:9, 20]) > 0).all() and (np.diff(w[-9:, 20]) < 0).all()


def test_a_frame_pasted_across_tiles_and_the_torus_edge_comes_back_where_it_lay() -> None:
    seen: seen_px.Seen = {}
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (3, 64, 64), dtype=np.uint8)
    first = (SIDE * TILE_UNITS - 20, 30)  # 20 units above the torus's edge, across two tile columns
    seen_px.paste(seen, first, rgb, np.ones((64, 64), np.float32), SIDE)
    assert sorted(seen) == [(0, 0), (0, 1), (SIDE - 1, 0), (SIDE - 1, 1)]
    raster = torch.zeros(3, 2 * TILE_UNITS, 2 * TILE_UNITS)
    out = seen_px.compose(raster, seen, SIDE - 1, 0, SIDE)  # the 2 x 2 tiles from the one above the edge
    got = np.rint((out.numpy() + 1) * 127.5).astype(np.uint8)
    y0 = TILE_UNITS - 20
    assert np.array_equal(got[:, y0 : y0 + 64, 30:94], rgb)
    assert (out[:, :y0] == 0).all() and (out[:, :, :30] == 0).all()  # nothing seen there: the raster as it was


def test_a_later_observation_lies_over_an_earlier_one_by_its_weight() -> None:
    seen: seen_px.Seen = {}
    dark, light = np.full((3, 8, 8), 40, np.uint8), np.full((3, 8, 8), 200, np.uint8)
    seen_px.paste(seen, (0, 0), dark, np.ones((8, 8), np.float32), SIDE)
    seen_px.paste(seen, (0, 4), light, np.full((8, 8), 0.5, np.float32), SIDE)
    tile = seen[(0, 0)]
    assert (tile[:3, :8, :4] == 40).all() and (tile[3, :8, :4] == 255).all()  # the earlier alone
    assert (tile[:3, :8, 4:8] == 120).all() and (tile[3, :8, 4:8] == 255).all()  # half of each
    assert (tile[:3, :8, 8:12] == 200).all() and (tile[3, :8, 8:12] == 128).all()  # the later alone, half weight


def test_a_session_starts_on_the_frame_it_was_given_where_the_codes_alone_are_soft() -> None:
    world = _world()
    frame = world.render(BUCKET)
    painter = _painter()
    errors = {}
    for keep in (True, False):
        painter.keep_seen = keep
        try:
            g = painter.start(1, world.scene)
            painter.observe(g, frame)
            errors[keep] = np.abs(_img(painter.reference(g, g.position[None], BUCKET)[0]) - frame)
        finally:
            painter.keep_seen = True
    inner = slice(seen_px.FEATHER, -seen_px.FEATHER)
    assert errors[True][inner, inner].max() < 1.0  # the frame itself, to rounding
    assert errors[True].mean() < 0.5 * errors[False].mean()  # the codes' decode alone is softer (about 10 levels)
    # its edges fade into the decode of its own codes, not into a straight line
    assert errors[True][0].mean() > errors[True][inner, inner].mean()


def test_a_frame_observed_between_whole_units_is_kept_where_it_lay() -> None:
    world = _world()
    frame = world.render(BUCKET)
    painter = _painter()
    g = painter.start(1, world.scene)
    g.position = np.array([3.25, 7.5])
    painter.observe(g, frame)
    assert sorted(g.seen) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    ref = _img(painter.reference(g, g.position[None], BUCKET)[0])
    inner = slice(seen_px.FEATHER + 1, -seen_px.FEATHER - 1)
    assert np.abs(ref - frame)[inner, inner].mean() < 6  # sampled twice between pixels: softened, in place
    moved = _img(painter.reference(g, (g.position + 3)[None], BUCKET)[0])
    assert np.abs(moved - frame)[inner, inner].mean() > 2 * np.abs(ref - frame)[inner, inner].mean()


def test_a_scene_change_drops_the_seen_pixels_and_the_codes_reskin_the_place() -> None:
    world = _world()
    painter = _painter()
    g = painter.start(1, world.scene)
    painter.observe(g, world.render(BUCKET))
    assert g.seen
    painter.rescene(g, SceneAttrs(time="night"))
    assert not g.seen


def test_a_snapshot_carries_the_seen_pixels_and_the_restored_session_makes_the_same_frames() -> None:
    frame = _world(8).render(BUCKET)
    src = make_runner(tiny_config(), ground=_painter())
    src.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, 9, SCENE, observation=frame)]))

    run_chunks(src, 0, [key_action(1)] * 3)
    state = src.export_state("s")
    assert len(state.family_state["canvas_seen"]) >= 1
    session = Session.create(SessionConfig(fps=24.0, bucket=BUCKET, steps=2), scene=SCENE)[0]
    data = snapshot(session, state)
    restored = restore(data)[1]
    dst = make_runner(tiny_config(), ground=_painter())
    dst.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, 9, state.scene, restore=restored)]))
    a, b = run_chunks(src, 3, [key_action(1)] * 6), run_chunks(dst, 3, [key_action(1)] * 6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    ga, gb = src.sessions["s"].ref, dst.sessions["s"].ref
    assert ga is not None and gb is not None and ga.seen.keys() == gb.seen.keys()
    assert all(np.array_equal(ga.seen[k], gb.seen[k]) for k in ga.seen)

    # a malformed seen layer is refused with a clear error, not taken in
    obj = msgpack.unpackb(data, raw=False)
    seen = obj["model"]["family_state"]["canvas_seen"]
    seen["shape"] = [seen["shape"][0], 4, 32, 128]
    bad = restore(msgpack.packb(obj, use_bin_type=True))[1]
    other = make_runner(tiny_config(), ground=_painter())
    out = other.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, 9, state.scene, restore=bad)]))
    assert "canvas_seen: expected uint8" in out.errors["s"] and "s" not in other.sessions
