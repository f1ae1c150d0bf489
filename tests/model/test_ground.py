"""The world canvas in serving (model/default/reference/canvas/ground.py, quilt.py): the ground under the camera
is the place the session saw or the prior drew there, it stays when the camera comes back,
a snapshot carries it exactly, and memory stays bounded."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from tests.model.conftest import key_action, make_runner, run_chunks, tiny_config
from worldserve.model.default.reference.canvas.canvas import TILE, TILE_UNITS, Canvas
from worldserve.model.default.reference.canvas.ground import MAP_SIZE, RADIUS, GroundPainter
from worldserve.model.default.reference.canvas.quilt import (
    GroundBank,
    bank_key,
    fill_tile,
    look_key,
)
from worldserve.model.default.runner import ModelRunner
from worldserve.session.plan import (
    SessionSpec,
    SessionUpdate,
    StepPlan,
)
from worldserve.session.session import Session, SessionConfig
from worldserve.session.snapshot import restore, snapshot
from worldserve.world import World, start_frame, start_views
from worldserve.world.scene import SceneAttrs, parse_prompt

BUCKET = 64
SCENE = "a grassy village by day"


@functools.cache
def _painter() -> GroundPainter:
    return GroundPainter.load(torch.device("cpu"))


def _runner() -> ModelRunner:
    return make_runner(tiny_config(), ground=_painter())


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(255**2 / np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)))


def test_the_bank_holds_every_look_in_every_season_and_a_season_s_maps_are_its_own() -> None:
    bank = GroundBank.load()
    from worldserve.world.scene import ATTRIBUTES

    for b in ATTRIBUTES["biome"]:
        for v in ATTRIBUTES["vegetation"]:
            for w in ATTRIBUTES["weather"]:
                for s in ATTRIBUTES["season"]:
                    scene = SceneAttrs(biome=b, vegetation=v, weather=w, season=s, time="night")
                    assert bank_key(scene) in bank.maps
                    assert bank.for_scene(scene) is bank.maps[bank_key(scene)]
    # a look's seasons are one world: where trees stand their codes differ with the season
    forest = [bank.maps[bank_key(SceneAttrs(vegetation="dense", season=s))] for s in ATTRIBUTES["season"]]
    assert all(0.05 < (forest[0] != m).mean() for m in forest[1:])
    # a bank keyed by look alone (no seasons) still serves every season from its look's maps
    old = GroundBank({look_key(SceneAttrs()): forest[0]})
    assert old.for_scene(SceneAttrs(season="autumn")) is forest[0]


def test_the_prior_draws_the_same_ground_from_the_same_seed_and_continues_its_neighbours() -> None:
    painter = _painter()
    maps = painter.bank.for_scene(SceneAttrs())
    canvas = Canvas(MAP_SIZE, RADIUS)
    canvas.write((4, 4), maps[0, :TILE, :TILE])
    right = fill_tile(canvas, (4, 5), maps, painter.sim, seed=7)
    assert np.array_equal(right, fill_tile(canvas, (4, 5), maps, painter.sim, seed=7))
    assert not np.array_equal(right, fill_tile(canvas, (4, 5), maps, painter.sim, seed=8))
    # the column next to the written tile agrees with it better than a window drawn at random
    table = painter.table
    edge = (table[canvas.tiles[(4, 4)][:, -1]] * table[right[:, 0]]).sum(-1).mean()
    rng = np.random.default_rng(0)
    edge_codes = table[canvas.tiles[(4, 4)][:, -1]]
    rand = np.mean([(edge_codes * table[maps[0, rng.integers(0, 60, TILE), rng.integers(0, 64)]]).sum(-1).mean()
                    for _ in range(20)])
    assert edge > rand


def test_the_view_shows_the_observed_place_and_the_same_place_on_return() -> None:
    world = World(5, SceneAttrs(), (BUCKET,))
    world.reset((300.0, 300.0))
    painter = _painter()
    g = painter.start(1, world.scene)
    painter.observe(g, world.render_ground(BUCKET), seen=False)
    first = painter.reference(g, g.position[None], BUCKET)
    # the observed ground itself (its pixels kept, fading at the edges into its codes' decode)
    img = ((first[0, :3].permute(1, 2, 0).numpy() + 1) * 127.5).clip(0, 255).astype(np.uint8)
    assert _psnr(img, world.render_ground(BUCKET)) > 30  # 31.2 here; its codes alone, 25.0
    assert (first[0, 3] == 1).all()
    # out of view and back, then 250 units away on both axes (3 s with a key held and the
    # mouse drifting) and back: a place is kept however far the session went
    for dy, dx in ((0, 90), (90, 0), (0, -90), (-90, 0), (0, 250), (250, 0), (0, -250), (-250, 0)):
        g.pending = g.position + np.array([dy, dx], np.float64)
        painter.reference(g, g.pending[None], BUCKET)
        painter.moved(g)
    assert np.allclose(g.position, 0.0)
    assert torch.equal(painter.reference(g, g.position[None], BUCKET), first)


def test_a_prompt_change_reskins_the_same_codes() -> None:
    painter = _painter()
    g = painter.start(3, SceneAttrs())
    day = painter.reference(g, g.position[None], BUCKET)
    codes = {k: c.copy() for k, c in g.canvas.tiles.items()}
    painter.rescene(g, SceneAttrs(time="night"))
    night = painter.reference(g, g.position[None], BUCKET)
    assert all(np.array_equal(g.canvas.tiles[k], c) for k, c in codes.items())  # more around, none redrawn
    assert night[:, :3].mean() < day[:, :3].mean() - 0.1
    painter.rescene(g, SceneAttrs(biome="snow"))  # a look the codes never had
    assert not any(np.array_equal(g.canvas.tiles.get(k, -1), c) for k, c in codes.items())  # drawn anew
    snow = painter.reference(g, g.position[None], BUCKET)
    assert snow[:, :3].mean() > day[:, :3].mean() + 0.1


def test_memory_stays_bounded_however_far_the_session_goes() -> None:
    runner = _runner()
    runner.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, 4, SCENE)]))
    run_chunks(runner, 0, [key_action(2)] * 150)  # 2 units a frame: 300 units
    g = runner.sessions["s"].ref
    # codes: at most the torus's 256 tiles (128 KB), whatever the session saw is kept
    assert g is not None and 0 < len(g.canvas.tiles) <= g.canvas.max_tiles == (MAP_SIZE // TILE_UNITS) ** 2 == 256
    g.settle()
    assert len(g.pixels) + len(g.ahead) <= 16  # the view's 2 x 2 tiles and the ring around them


def test_tiles_are_decoded_ahead_of_the_camera_to_the_pixels_an_inline_decode_gives() -> None:
    world = World(5, SceneAttrs(), (BUCKET,))
    world.reset((300.0, 300.0))
    ahead, inline = _painter(), GroundPainter.load(torch.device("cpu"), ahead=False)
    views = []
    for painter in (ahead, inline):
        g = painter.start(4, world.scene)
        painter.observe(g, world.render_ground(BUCKET), seen=False)
        g.settle()  # the fills ahead are done, the decodes queued
        # the view's tiles and the ring around them are being decoded before any frame needs them
        assert len(g.ahead) + len(g.pixels) == 16 and all(painter._decodable(g, k) for k in g.ahead)
        out = []
        for _ in range(12):  # a tile and a half to the right, a chunk of 3 frames at a time
            tops = g.position + np.array([[0.0, 8.0 * (f + 1)] for f in range(3)])
            out.append(painter.reference(g, tops, BUCKET))
            g.pending = tops[-1]
            painter.moved(g)
            g.settle()
            # the next tile to the right is ready or under way before the view reaches it
            ty, tx = (int(t // 64) for t in g.position)
            assert (ty, (tx + 2) % g.canvas.side) in {**g.pixels, **g.ahead}
        views.append(torch.stack(out))
    assert torch.equal(views[0], views[1])


@pytest.mark.parametrize("scene_change", [False, True])
def test_a_restored_session_goes_on_with_the_same_ground_and_frames(scene_change: bool) -> None:
    src = _runner()
    src.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, 9, SCENE)]))
    run_chunks(src, 0, [key_action(0)] * 20 + [key_action(3)] * 10)  # new ground drawn on the way
    if scene_change:
        src.execute(StepPlan(updates=[SessionUpdate("s", scene="a snowy village at night")]))
    state = src.export_state("s")
    assert "canvas_codes" in state.family_state
    session = Session.create(SessionConfig(fps=24.0, bucket=BUCKET, steps=2), scene=SCENE)[0]
    restored = restore(snapshot(session, state))[1]
    dst = _runner()
    dst.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, 9, state.scene, restore=restored)]))
    later = [key_action(1)] * 12 + [key_action(2)] * 12
    a, b = run_chunks(src, 30, later), run_chunks(dst, 30, later)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    ga, gb = src.sessions["s"].ref, dst.sessions["s"].ref
    assert ga is not None and gb is not None
    ka, ca = ga.canvas.to_arrays()
    kb, cb = gb.canvas.to_arrays()
    assert np.array_equal(ka, kb) and np.array_equal(ca, cb) and np.array_equal(ga.position, gb.position)


def test_a_session_opened_on_the_start_frame_a_server_made_off_thread_starts_on_the_same_ground() -> None:
    # A server renders a fresh session's first frame on a worker thread (``first_frame``) and
    # opens the session with it as the observation: the canvas must start from the ground
    # under that view, as when the runner starts the session itself (a drill's reference run).
    def runner() -> ModelRunner:
        return make_runner(tiny_config(), ground=_painter(), start_frame=start_frame, start_views=start_views)

    seed, path = 4, [key_action(0)] * 6 + [key_action(2)] * 6
    own = runner()
    own.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, seed, SCENE)]))
    served = runner()
    first = served.first_frame(SCENE, seed, BUCKET)
    assert first is not None
    served.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, seed, SCENE, observation=first)]))
    a, b = run_chunks(own, 0, path), run_chunks(served, 0, path)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    ka, ca = own.sessions["s"].ref.canvas.to_arrays()  # type: ignore[union-attr]
    kb, cb = served.sessions["s"].ref.canvas.to_arrays()  # type: ignore[union-attr]
    assert np.array_equal(ka, kb) and np.array_equal(ca, cb)
    # any other observation is what the client saw: written as it is, actors and all
    view = start_frame(SCENE, seed, BUCKET)
    client = runner()
    client.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, seed, SCENE, observation=view.copy())]))
    as_seen = _painter().start(seed, parse_prompt(SCENE))
    _painter().observe(as_seen, view)
    kc, cc = client.sessions["s"].ref.canvas.to_arrays()  # type: ignore[union-attr]
    ks, cs = as_seen.canvas.to_arrays()
    assert np.array_equal(kc, ks) and np.array_equal(cc, cs)


def test_the_server_setting_loads_the_default_model_with_its_canvas() -> None:
    from worldserve.model import registry

    runner = registry.load("default", registry.LoadOptions(canvas=True, cpu_trace=False, max_sessions=2))
    assert isinstance(runner, ModelRunner) and runner.ground is not None
    assert registry.load("default", registry.LoadOptions(cpu_trace=False, max_sessions=2)).ground is None


def test_a_ring_tile_still_queued_when_the_view_reaches_it_is_queued_again_ahead_of_the_rings() -> None:
    painter = GroundPainter.load(torch.device("cpu"))  # its own decoder: held inside a chunk below
    try:
        with painter.busy():  # the decoder's thread starts nothing: every decode stays queued
            g = painter.start(4, SceneAttrs())
            painter.prepare(g)
            g.settle()  # the fills, taken back and done here; the decodes queued
            view = set(painter._around(g, g.position, 0))
            assert {k for k, j in g.ahead.items() if j.urgency == 1} == view and len(g.ahead) == 16
            ty, tx = (int(t // 64) for t in g.position)
            side = g.canvas.side
            ring, behind = (ty % side, (tx + 2) % side), (ty % side, (tx - 1) % side)
            old_ring, old_behind = g.ahead[ring], g.ahead[behind]
            assert old_ring.urgency == 2
            g.pending = g.position + np.array([0.0, 64.0])  # a tile to the right
            painter.moved(g)
            g.settle()
            assert g.ahead[ring].urgency == 1 and g.ahead[ring] is not old_ring  # now the view's
            assert old_ring.future.cancelled() and old_behind.future.cancelled()  # left behind: dropped
            assert behind not in g.ahead
    finally:
        painter.close()


def test_neighbouring_tiles_fade_into_each_other_across_their_shared_edges() -> None:
    from worldserve.model.default.reference.canvas.ground import _blend
    from worldserve.model.default.reference.canvas.tile_decode import BLEND

    t, b = 64, BLEND
    tiles = [[torch.full((3, t + 2 * b, t + 2 * b), float(v)) for v in row] for row in ((0.0, 1.0), (0.0, 1.0))]
    raster = _blend(tiles)
    assert raster.shape == (3, 2 * t, 2 * t)
    row = raster[0, 10]
    assert torch.equal(row[: t - b], torch.zeros(t - b)) and torch.equal(row[t + b :], torch.ones(t - b))
    band = row[t - b : t + b]
    assert (band.diff() > 0).all() and torch.allclose(band.diff(), band.diff()[0].expand(2 * b - 1))  # a linear fade
    same = _blend([[torch.full((3, t + 2 * b, t + 2 * b), 0.25)] * 2] * 2)
    assert torch.allclose(same, torch.full_like(same, 0.25))  # the weights sum to one everywhere


def test_the_world_s_own_codes_decoded_tile_by_tile_show_no_seams() -> None:
    from worldserve.bench.prior import edge_ratio, tile_edges
    from worldserve.training.ground_bank import code_map

    painter = _painter()
    views, rows, cols = [], [], []
    for seed in (3, 7, 11):
        world = World(seed, SceneAttrs(), (BUCKET,), map_size=256)
        g = painter.start(1, SceneAttrs())
        g.canvas.paste((0.0, 0.0), code_map(painter.tokenizer, world, 256).astype(np.int64))
        for top in ([40.0, 40.0], [100.0, 20.0], [20.0, 100.0], [90.0, 90.0], [160.0, 150.0], [140.0, 60.0]):
            ref = painter.reference(g, np.array([top]), BUCKET)[0, :3]
            views.append(((ref.permute(1, 2, 0).numpy() + 1) * 127.5).round().astype(np.uint8))
            r, c = tile_edges(np.array(top))
            rows.append(r)
            cols.append(c)
    # the step between neighbouring pixels across tile edges over that everywhere: with the
    # tiles abutting, 1.22 / 1.25 / 1.34 in these three worlds; faded, 1.11 / 0.75 / 1.15
    assert edge_ratio(np.stack(views), rows, cols) < 1.15


def test_a_place_keeps_its_colours_whatever_the_prior_drew_around_it() -> None:
    """The decoder's norms take their statistics near each pixel (``LocalGroupNorm``): the same
    codes decode to the same colours beside any neighbours. With statistics over the whole
    decoded crop (tile and margin) a village under a desert sky came out 17 grey levels redder
    in green beside the prior's red ground than decoded alone."""
    from worldserve.training.ground_bank import code_map

    painter = _painter()
    look = SceneAttrs(biome="desert", vegetation="dense")
    world = World(3, look, (BUCKET,), map_size=256)
    place = code_map(painter.tokenizer, world, 256)[:TILE, :TILE].astype(np.uint16)
    means = []
    for other in ("snow", "desert", "tropical"):  # the ground around it, from three looks of the bank
        maps = painter.bank.for_scene(SceneAttrs(biome=other, vegetation="sparse", weather="fog"))
        g = painter.start(1, look)
        side = g.canvas.side
        for i in (-1, 0, 1):
            for j in (-1, 0, 1):
                key = (i % side, j % side)
                around = maps[0, 40 + 16 * i : 56 + 16 * i, 40 + 16 * j : 56 + 16 * j]
                g.canvas.write(key, place if key == (0, 0) else around)
        ref = painter.reference(g, np.zeros((1, 2)), BUCKET)[0, :3, 16:48, 16:48]  # the tile's middle
        means.append((ref.mean((1, 2)) + 1) * 127.5)
    spread = torch.stack(means).amax(0) - torch.stack(means).amin(0)  # per colour channel, grey levels
    assert spread.max() < 2.0, spread


def test_the_view_kept_between_frames_is_the_one_made_afresh_and_follows_observations_and_prompts() -> None:
    """A session's blended tiles and its whole tiles are kept while the view stays on them
    (``_raster``, ``_fill_around``): along a path with an observation and a prompt change on
    the way, every reference is the one a session that kept nothing makes, bit for bit, and
    an observation shows at once where it lies."""
    world = World(7, SceneAttrs(), (BUCKET,))
    world.reset((200.0, 520.0))
    painter = _painter()
    kept, fresh = painter.start(3, world.scene), painter.start(3, world.scene)
    for g in (kept, fresh):
        painter.observe(g, world.render_ground(BUCKET))
    steps = [np.array([0.0, 1.7])] * 30 + [np.array([1.3, -0.6])] * 30
    for t, step in enumerate(steps):
        if t == 20:  # the world's view 40 units on, shown where the camera is
            world.reset((float(kept.position[0]) + 32, float(kept.position[1]) + 32))
            before = painter.reference(kept, kept.position[None], BUCKET)
            for g in (kept, fresh):
                painter.observe(g, world.render_ground(BUCKET))
            after = painter.reference(kept, kept.position[None], BUCKET)
            assert not torch.equal(before, after)  # the kept view did not hide the new pixels
        if t == 40:
            for g in (kept, fresh):
                painter.rescene(g, parse_prompt("a green forest at dusk"))
        fresh.raster = fresh.whole = None  # nothing kept: every tile looked at, the tiles blended anew
        refs = [painter.reference(g, (g.position + step)[None], BUCKET) for g in (kept, fresh)]
        assert torch.equal(refs[0], refs[1]), t
        for g in (kept, fresh):
            g.pending = g.position + step
            painter.moved(g)
    assert kept.raster is not None and kept.whole is not None


def test_a_closed_session_s_queued_tiles_are_dropped_and_the_ring_nearest_the_view_queues_first() -> None:
    """A session's look-ahead queued on the decoder's thread goes with it (left, it would hold
    up live sessions' tiles for decodes nobody looks at), and its ring's tiles are queued
    nearest the view first: those the view reaches first are decoded first."""
    painter = GroundPainter.load(torch.device("cpu"))  # its own decoder: held inside a chunk below
    try:
        with painter.busy():  # the decoder's thread starts nothing: every decode stays queued
            g = painter.start(4, SceneAttrs())
            g.position = np.array([100.0, 300.0])  # the view's centre 4 units off its 2 x 2 tiles' centre
            painter.prepare(g)
            g.settle()
            queued = sorted(painter.decoder._queue)  # (urgency, order, ...): the thread's order
            tile_of = {id(j.future): k for k, j in g.ahead.items()}
            order = [tile_of[id(item[2])] for item in queued if id(item[2]) in tile_of]
            assert len(order) == len(g.ahead) == 16
            centre = g.position + 32
            far = [max(abs((np.array(k) + 0.5) * 64 - centre)) for k in order[4:]]
            assert far == sorted(far) and far[0] < far[-1]  # the ring, nearest first
            jobs = list(g.ahead.values())
            painter.release(g)
            assert all(j.future.cancelled() for j in jobs) and not g.ahead and not g.pixels
    finally:
        painter.close()


def test_the_runner_releases_a_freed_session_s_ground() -> None:
    runner = _runner()
    assert runner.ground is not None
    released: list[object] = []
    runner.ground.release = released.append  # type: ignore[method-assign]
    runner.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, 4, SCENE)]))
    run_chunks(runner, 0, [key_action(2)] * 2)
    g = runner.sessions["s"].ref
    runner.free("s")
    assert released == [g]
