"""Steering for the load benches (``bench.serve_load``, ``bench.ladder_burn``): every session
holds a random key, changed every 250 ms, as players do."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from worldserve.server.engine import Engine
from worldserve.session.plan import ACTION_DIM


async def steer(engine: Engine, ids: list[str], stop: asyncio.Event,
                each_tick: Callable[[], None] | None = None) -> None:
    rng = np.random.default_rng(0)
    seq = 0
    while not stop.is_set():
        for sid in ids:
            a = np.zeros(ACTION_DIM, np.float32)
            a[int(rng.integers(4))] = 1.0
            seq += 1
            engine.scheduler.set_action(sid, a, seq)
        if each_tick is not None:
            each_tick()
        await asyncio.sleep(0.25)
