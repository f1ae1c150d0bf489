from __future__ import annotations

import numpy as np
import pytest

from worldserve.world import World
from worldserve.world.layout import Layout, build_layout

SMALL_MAP = 256  # world units: small worlds build in a fraction of a second


@pytest.fixture(scope="package")
def layout() -> Layout:
    return build_layout(7, SMALL_MAP, density=2)


@pytest.fixture
def world(layout: Layout) -> World:
    """A fresh small world (seed 7) on the shared layout, camera on a village."""
    return World(7, None, (64, 128), map_size=SMALL_MAP, layout=layout)


def dry_start(world: World) -> tuple[float, float]:
    """A camera centre with mostly land in view, fixed for the seed."""
    return world.random_position(np.random.default_rng(0), max_water=0.3)
