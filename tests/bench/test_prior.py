"""bench.prior's seam measure (where a canvas tile begins in a view, and how much larger the
steps across those edges are than the steps everywhere) and its shares of built ground and water."""

from __future__ import annotations

import numpy as np

from worldserve.bench.prior import built_cells, cover_share, edge_ratio, tile_edges, water_cells
from worldserve.model.default.reference.canvas.canvas import MISSING
from worldserve.world import World


def test_tile_edges_are_where_the_next_tile_begins_in_the_view() -> None:
    rows, cols = tile_edges(np.array([10.0, 70.0]))
    assert rows.tolist() == [54] and cols.tolist() == [58]
    rows, cols = tile_edges(np.array([64.0, 0.0]))  # a view on a tile's corner crosses none
    assert rows.tolist() == [0] and cols.tolist() == [0]


def test_a_step_at_the_tile_edge_reads_far_above_one_and_a_smooth_ramp_near_one() -> None:
    i = np.arange(64)
    ramp = np.repeat((2 * (i[:, None] + i[None, :]))[..., None], 3, -1).clip(0, 255).astype(np.uint8)  # dy = dx
    stepped = ramp.copy()
    stepped[:, 30:] = np.clip(stepped[:, 30:].astype(int) + 40, 0, 255).astype(np.uint8)
    assert abs(edge_ratio(ramp[None], [np.array([])], [np.array([30])]) - 1.0) < 0.1
    assert edge_ratio(stepped[None], [np.array([])], [np.array([30])]) > 5


def test_a_village_is_built_ground_and_open_sea_is_water_not_built() -> None:
    world = World(3, None, (64,), map_size=256)
    world.reset(world.layout.start)  # the first village
    assert built_cells(world).mean() > 0.05
    water = world.layout.walk_water  # (256, 256): a boat may float here
    open_sea = [(y, x) for y in range(32, 224, 8) for x in range(32, 224, 8)
                if water[y - 32 : y + 32, x - 32 : x + 32].all()]
    assert open_sea, "the world has a view of open water"
    world.reset(tuple(float(c) for c in open_sea[0]))
    assert not built_cells(world).any()
    assert water_cells(world).all()  # and it is water, where the village is mostly land
    world.reset(world.layout.start)
    assert water_cells(world).mean() < 0.5


def test_cover_share_reads_each_side_through_the_chances_counted_on_the_world() -> None:
    world_ids = np.array([[[0, 0], [1, 2]]])  # code 0 lies on built ground both times, 1 never, 2 once in two
    built = np.array([[[True, True], [False, False]]])
    world_ids = np.concatenate([world_ids, np.array([[[2, 1], [1, 1]]])])
    built = np.concatenate([built, np.array([[[True, False], [False, False]]])])
    canvas = np.array([[[0, 0], [0, MISSING]]])  # only built codes: share 1.0, the missing one skipped
    world, held = cover_share(world_ids, built, canvas, 4)
    assert world == built.mean() and held == 1.0
    assert cover_share(world_ids, built, np.array([[[1, 1], [3, 2]]]), 4)[1] == 0.5 / 4  # 3: never seen
