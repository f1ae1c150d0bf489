"""End to end: ``--model matrix-game-2`` on a tiny random ``--weights`` directory through a real
server (aiohttp, WebSocket msgpack) and the SDK: ``started`` lists keys, mouse and observation;
a session anchored on the client's observation with forward held makes other pictures than the
same session with no keys; an observation mid-stream is acknowledged and changes what follows."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np

from tests.model.wan.tiny_mg_dir import HEIGHT, WIDTH
from tests.server.harness import Served, serve
from worldserve.clients.sdk import FrameEvent, WorldClient
from worldserve.server.app import load_model_runner

FIRST, STEADY = 5, 8  # frames of block 0 and of every later block (2 latent frames a chunk)


@asynccontextmanager
async def mg_server(mg_dir: Path) -> AsyncIterator[Served]:
    async with serve(
        runner_factory=load_model_runner, model="matrix-game-2", weights=mg_dir, sizes=((HEIGHT, WIDTH),),
        dtype="float32", threads=1, warmup_batch_sizes=(1, 2), warmup_steps=(3,), admission_threshold=1e9, capacity=4,
    ) as s:
        yield s


def start_image() -> np.ndarray:
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    return np.stack(((x * 5) % 256, (y * 7) % 256, np.full_like(x, 90)), -1).astype(np.uint8)


async def frames_until(client: WorldClient, frame: int) -> dict[int, np.ndarray]:
    got: dict[int, np.ndarray] = {}
    while frame not in got:
        ev = await client.recv(30)
        if isinstance(ev, FrameEvent):
            assert ev.image is not None and ev.image.shape == (HEIGHT, WIDTH, 3)
            got[ev.msg.frame] = ev.image
    return got


async def session(mg_dir: Path, s: Served, keys: tuple[str, ...], *, observe_at: int | None = None
                  ) -> tuple[tuple[str, ...], dict[int, np.ndarray]]:
    """Pull mode, so that every block is made with the action held before it was asked for."""
    async with WorldClient(s.ws_url, http=s.http) as client:
        started = await client.start("", seed=4, fps=16.0, bucket=HEIGHT, codec="raw", mode="pull",
                                     observation=start_image())
        if keys:
            await client.action(keys=keys)
        got = await frames_until(client, FIRST - 1)
        for n in range(1, 4):
            if n == observe_at:
                await client.observe(np.full((HEIGHT, WIDTH, 3), 230, np.uint8))
            await client.request(n)
            got |= await frames_until(client, FIRST + n * STEADY - 1)
        return started.controls, got


async def test_held_keys_move_the_picture_and_started_lists_the_controls(mg_dir: Path) -> None:
    async with mg_server(mg_dir) as s:
        controls, still = await session(mg_dir, s, ())
        _, again = await session(mg_dir, s, ())
        _, forward = await session(mg_dir, s, ("forward",))
    assert controls == ("keys", "mouse", "observation")
    assert sorted(still) == list(range(FIRST + 3 * STEADY))
    last = FIRST + 3 * STEADY - 1
    np.testing.assert_array_equal(still[last], again[last])  # the same inputs make the same stream
    assert np.abs(still[last].astype(int) - forward[last]).mean() > 0.5


async def test_an_observation_mid_stream_re_anchors_what_follows(mg_dir: Path) -> None:
    async with mg_server(mg_dir) as s:
        _, plain = await session(mg_dir, s, ())
        _, anchored = await session(mg_dir, s, (), observe_at=2)
    block1_end, last = FIRST + STEADY - 1, FIRST + 3 * STEADY - 1
    np.testing.assert_array_equal(plain[block1_end], anchored[block1_end])  # before it: unchanged
    assert np.abs(plain[last].astype(int) - anchored[last]).mean() > 0.5
