"""A worker serving ``--model matrix-game-2`` (a tiny random ``--weights`` directory) drains
under a steered session: the session moves to the other worker through a snapshot and goes on
with exactly the frames the same session makes undisturbed (its keys, mouse, anchor image and
noise carried; the caches replayed under the actions they were made with)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from tests.model.wan.test_serve_matrix_game import FIRST, STEADY, start_image
from tests.model.wan.tiny_mg_dir import HEIGHT, WIDTH
from tests.scaleout.harness import Cluster, cluster
from worldserve.clients.sdk import FrameEvent, WorldClient
from worldserve.server.app import load_model_runner

BLOCKS, DRAIN_AFTER = 8, 4


def settings(mg_dir: Path) -> dict[str, object]:
    return dict(
        runner_factory=load_model_runner, model="matrix-game-2", weights=mg_dir, sizes=((HEIGHT, WIDTH),),
        dtype="float32", threads=1, warmup_batch_sizes=(1,), warmup_steps=(3,), capacity=2,
    )


def last_frame(block: int) -> int:
    return FIRST - 1 + block * STEADY


async def blocks(client: WorldClient, first: int, end: int) -> dict[int, np.ndarray]:
    """Pull blocks first .. end - 1, each made after the one before was received."""
    got: dict[int, np.ndarray] = {}
    for n in range(first, end):
        if n:
            await client.request(n)
        while last_frame(n) not in got:
            ev = await client.recv(60)
            if isinstance(ev, FrameEvent):
                assert ev.image is not None
                got[ev.msg.frame] = ev.image
    return got


async def steered(c: Cluster, *, drain: bool) -> tuple[dict[int, np.ndarray], int]:
    async with WorldClient(router=c.router_url, http=c.http) as client:
        await client.start("", seed=4, fps=16.0, bucket=HEIGHT, codec="raw", mode="pull", observation=start_image())
        got = await blocks(client, 0, 1)  # made at the start: before any action can arrive
        await client.action(keys=("forward", "left"), mouse=(0.4, -0.2))  # held from block 1 on
        got |= await blocks(client, 1, DRAIN_AFTER)
        if drain:
            await c.drain(await c.holder(client.session_id or ""))
            for _ in range(600):
                if client.migrations:
                    break
                await asyncio.sleep(0.05)
        got |= await blocks(client, DRAIN_AFTER, BLOCKS)
        return got, client.migrations


async def test_a_drained_session_goes_on_with_the_frames_of_an_undisturbed_one(mg_dir: Path) -> None:
    async with cluster(2, **settings(mg_dir)) as c:
        undisturbed, moved = await steered(c, drain=False)
        assert moved == 0
        migrated, moved = await steered(c, drain=True)
    assert moved == 1
    assert sorted(migrated) == sorted(undisturbed) == list(range(last_frame(BLOCKS - 1) + 1))
    for f in sorted(undisturbed):
        np.testing.assert_array_equal(migrated[f], undisturbed[f], err_msg=f"frame {f}")
