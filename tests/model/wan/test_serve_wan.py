"""End to end: ``--model wan-causal`` on a tiny random ``--weights`` directory, through a real
server (aiohttp, WebSocket msgpack) and the SDK: push, pull, a dropped connection, a drain that
migrates the session to another worker by re-cache."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest

import tests.scaleout.harness as scaleout
from tests.model.wan.tiny_dir import HEIGHT, WIDTH
from tests.server.harness import Served, serve
from worldserve.clients.sdk import FrameEvent, WorldClient
from worldserve.protocol import Error, ErrorCode, Status
from worldserve.server.app import load_model_runner
from worldserve.server.keys import AGENT

FIRST, STEADY = 5, 8  # frames of block 0 and of every later block (2 latent frames a chunk)


def wan_settings(wan_dir: Path) -> dict[str, object]:
    return dict(
        model="wan-causal", weights=wan_dir, sizes=((HEIGHT, WIDTH),), dtype="float32", threads=1,
        warmup_batch_sizes=(1, 2), warmup_steps=(4,), admission_threshold=1e9, capacity=4,
    )


@asynccontextmanager
async def wan_server(wan_dir: Path) -> AsyncIterator[Served]:
    async with serve(runner_factory=load_model_runner, **wan_settings(wan_dir)) as s:
        yield s


def block_of(frame: int) -> int:
    return 0 if frame < FIRST else 1 + (frame - FIRST) // STEADY


async def frames_through(
    client: WorldClient, block: int, got: dict[int, FrameEvent], other: list[object] | None = None
) -> None:
    """Read frames until block ``block``'s last one (other messages go to ``other``); a frame
    seen twice (a block re-sent after a resume) must be the same picture."""
    last = client.block_start(block + 1) - 1
    while last not in got:
        ev = await client.recv(30)
        if not isinstance(ev, FrameEvent):
            if other is not None:
                other.append(ev)
            continue
        assert ev.image is not None and ev.image.shape == (HEIGHT, WIDTH, 3)
        assert block_of(ev.msg.frame) == ev.block_idx, (ev.msg.frame, ev.block_idx)
        if ev.msg.frame in got:
            assert np.array_equal(got[ev.msg.frame].image, ev.image), ev.msg.frame  # re-sent, not regenerated
        got[ev.msg.frame] = ev


def assert_whole(got: dict[int, FrameEvent], blocks: int) -> None:
    """Every frame of blocks 0..blocks-1 once, none missing."""
    end = FIRST + (blocks - 1) * STEADY
    assert sorted(f for f in got if f < end) == list(range(end))


async def test_push_session_streams_blocks_of_the_announced_sizes_and_says_once_that_keys_are_ignored(
    wan_dir: Path,
) -> None:
    async with wan_server(wan_dir) as s, WorldClient(s.ws_url, http=s.http) as client:
        started = await client.start("a red fox runs through snowy woods", seed=3, fps=16.0, bucket=HEIGHT,
                                     codec="raw")
        assert (started.width, started.height) == (WIDTH, HEIGHT)
        assert (started.first_chunk_frames, started.chunk_frames) == (FIRST, STEADY)
        assert started.controls == ("prompt",)
        got: dict[int, FrameEvent] = {}
        other: list[object] = []
        await frames_through(client, 0, got, other)
        await client.action(keys=("forward",))
        await client.action(keys=("left",), mouse=(0.5, 0.0))
        await client.prompt("a city street at night with neon lights")
        await frames_through(client, 3, got, other)
        assert_whole(got, 4)
        notices = [m for m in other if isinstance(m, Error)]  # once per kind the model does not take
        assert [(m.code, m.field, m.fatal) for m in notices] == [
            (ErrorCode.IGNORED_CONTROL, "keys", False), (ErrorCode.IGNORED_CONTROL, "mouse", False)]
        assert client.ended is None


async def test_a_session_plays_at_the_recipe_s_fps_and_status_and_v1_load_name_its_step_list(wan_dir: Path) -> None:
    settings = {**wan_settings(wan_dir), "model": "self-forcing", "status_interval_s": 0.2}
    async with serve(runner_factory=load_model_runner, **settings) as s, WorldClient(s.ws_url, http=s.http) as client:
        runner = s.service.engine.runner
        trained = [round(t, 3) for t in runner.cfg.step_timesteps]
        started = await client.start("a red fox runs through snowy woods", bucket=HEIGHT, codec="raw")
        assert started.fps == 16.0  # no fps asked: the recipe's, the rate its authors' videos play at
        status = None
        while status is None:
            ev = await client.recv(30)
            status = ev if isinstance(ev, Status) else None
        assert (status.recipe, status.steps) == ("self-forcing", 4)
        assert [round(t, 3) for t in status.timesteps] == trained
        async with s.http.get(s.url("/v1/load")) as resp:
            body = await resp.json()
        assert body["schedules"] == [{"recipe": "self-forcing", "steps": 4, "timesteps": trained, "sessions": 1}]
        assert body["recipe"]["schedules"] == {"4": trained}  # the one list it was trained for


async def test_pull_session_gets_each_block_it_asks_for(wan_dir: Path) -> None:
    async with wan_server(wan_dir) as s, WorldClient(s.ws_url, http=s.http) as client:
        await client.start("waves crash on a rocky shore", fps=16.0, bucket=HEIGHT, codec="raw", mode="pull")
        got: dict[int, FrameEvent] = {}
        await frames_through(client, 0, got)
        for n in (1, 2, 3):
            await client.request(n)
            await frames_through(client, n, got)
        assert_whole(got, 4)
        assert [got[f].block_idx for f in (0, FIRST - 1, FIRST, FIRST + STEADY)] == [0, 0, 1, 2]


async def test_a_dropped_connection_resumes_with_no_block_lost_or_repeated(wan_dir: Path) -> None:
    async with wan_server(wan_dir) as s, WorldClient(s.ws_url, http=s.http) as client:
        await client.start("a small boat drifts down a green river", fps=16.0, bucket=HEIGHT, codec="raw")
        got: dict[int, FrameEvent] = {}
        await frames_through(client, 1, got)
        client.simulate_drop()
        await frames_through(client, 5, got)
        assert_whole(got, 6)
        assert client.reconnects == 1 and client.resumed is not None
        assert client.resumed.first_chunk_frames == FIRST and client.resumed.controls == ("prompt",)


@pytest.mark.parametrize("mode", ["push", "pull"])
async def test_a_drain_migrates_the_session_to_another_worker_by_re_cache(
    wan_dir: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the scale-out harness's workers, serving the Wan model instead of its fake runner
    monkeypatch.setattr(scaleout, "fake_factory", lambda: load_model_runner)
    settings = wan_settings(wan_dir)
    settings.pop("capacity")
    async with scaleout.cluster(2, **settings) as c:
        client = WorldClient(router=c.router_url, http=c.http)
        try:
            await client.start("sunlight falls through tall pine trees", seed=5, fps=16.0, bucket=HEIGHT,
                               codec="raw", mode=mode)  # type: ignore[arg-type]
            got: dict[int, FrameEvent] = {}

            async def read(upto: int) -> None:
                for n in range(max(block_of(max(got, default=0)), 0), upto + 1):
                    if mode == "pull" and n > 0 and client.block_start(n) not in got and n > client._requested:
                        await client.request(n)
                    await frames_through(client, n, got)

            await read(2)
            src = await c.holder(client.session_id or "")
            await c.drain(src)
            await read(6)
            assert_whole(got, 7)
            assert client.migrations == 1
            assert await c.holder(client.session_id or "") == 1 - src
            await c.workers[src][AGENT].drained.wait()
        finally:
            await client.close()
