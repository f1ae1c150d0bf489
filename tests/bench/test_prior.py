"""bench.prior's seam measure: where a canvas tile begins in a view, and how much larger the
steps across those edges are than the steps everywhere."""

from __future__ import annotations

import numpy as np

from worldserve.bench.prior import edge_ratio, tile_edges


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
