"""End to end with the real model: the trained default weights, or a random-init model
saved to a temp dir before they exist (``model_weights`` in conftest.py).

The assertions hold for both: the same seed and inputs give the same frames, and a
different action or prompt gives different frames from the block it applies to.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import numpy as np

from tests.polling import until
from tests.server.harness import Served, frames, recv, recv_type, send, serve
from worldserve.protocol import (
    Ack,
    Action,
    Block,
    Error,
    Frame,
    Prompt,
    Resume,
    Resumed,
    Start,
    Started,
)
from worldserve.server.app import load_model_runner


def smallest_bucket(weights: Path) -> int:
    return int(json.loads(weights.with_suffix(".json").read_text())["buckets"][0])


@asynccontextmanager
async def model_server(weights: Path, **kw: object) -> AsyncIterator[Served]:
    bucket = smallest_bucket(weights)
    settings: dict[str, object] = dict(
        weights=weights,
        threads=1,
        buckets=(bucket,),
        warmup_batch_sizes=(1, 2),
        warmup_steps=(4,),  # other step counts are scaled from it by the cost model
        admission_threshold=1e9,  # noisy shared CPU: admission is tested with the fake runner
        capacity=4,
    )
    settings.update(kw)
    async with serve(runner_factory=load_model_runner, **settings) as s:
        yield s


def image(f: Frame) -> np.ndarray:
    assert f.codec == "raw"
    return np.frombuffer(f.data, np.uint8).reshape(f.height, f.width, 3).astype(np.int16)


def diff(a: Frame, b: Frame) -> float:
    return float(np.abs(image(a) - image(b)).mean())


async def pull_run(
    ws: aiohttp.ClientWebSocketResponse, bucket: int, blocks: int, change_at: int, change: object
) -> list[Frame]:
    """Blocks 0..blocks-1 of a fresh pull session; ``change`` is sent before ``change_at``."""
    await send(ws, Start("a green forest", seed=7, fps=4.0, bucket=bucket, codec="raw", mode="pull"))
    assert isinstance(await recv(ws), Started)
    got = await frames(ws, 1)
    for n in range(1, blocks):
        if n == change_at and change is not None:
            await send(ws, change)  # type: ignore[arg-type]
            if isinstance(change, Prompt):
                ack = await recv_type(ws, Ack)
                assert ack == Ack("prompt", change.id)
        await send(ws, Block(n))
        got += await frames(ws, 1)
    return got


async def test_pull_mode_gives_exactly_the_blocks_asked_and_actions_and_prompts_change_frames(
    model_weights: Path,
) -> None:
    bucket = smallest_bucket(model_weights)
    async with model_server(model_weights) as s:
        runs = {}
        for name, change in (
            ("plain", None),
            ("action", Action(1, ("forward", "right"))),
            ("prompt", Prompt("a snowy forest at night", id=5)),
        ):
            ws = await s.connect()
            runs[name] = await pull_run(ws, bucket, 8, 4, change)
            await ws.close()
    for got in runs.values():
        assert [f.block_idx for f in got] == list(range(8))
        assert all((f.width, f.height) == (bucket, bucket) for f in got)
    plain, action, prompt = runs["plain"], runs["action"], runs["prompt"]
    for i in range(4):  # same seed, same inputs: the same frames
        assert diff(plain[i], action[i]) < 1.0 and diff(plain[i], prompt[i]) < 1.0
    assert action[4].action_seq == 1 and plain[4].action_seq == 0
    assert np.mean([diff(plain[i], action[i]) for i in range(4, 8)]) > 2.0
    assert np.mean([diff(plain[i], prompt[i]) for i in range(4, 8)]) > 2.0


async def test_push_mode_streams_48_frames_and_held_keys_change_them(model_weights: Path) -> None:
    bucket = smallest_bucket(model_weights)
    async with model_server(model_weights) as s:
        plain, steered = await s.connect(), await s.connect()
        for ws in (plain, steered):
            await send(ws, Start("a green forest", seed=3, fps=8.0, bucket=bucket, codec="raw", lookahead=0))
            assert isinstance(await recv(ws), Started)
        await send(steered, Action(1, ("forward",)))
        got_plain, got_steered = await asyncio.gather(frames(plain, 48, 60), frames(steered, 48, 60))
    for got in (got_plain, got_steered):
        blocks = [f.block_idx for f in got]
        assert blocks == sorted(set(blocks)) and blocks[0] == 0  # in order, no repeats
        assert len(got) == 48
    assert got_steered[-1].action_seq == 1
    late = [(a, b) for a, b in zip(got_plain, got_steered, strict=True) if b.action_seq == 1][-10:]
    assert late and np.mean([diff(a, b) for a, b in late]) > 2.0


async def test_resume_after_a_dropped_connection_continues_at_the_next_block(
    model_weights: Path,
) -> None:
    bucket = smallest_bucket(model_weights)
    async with model_server(model_weights) as s:
        ws = await s.connect()
        await send(ws, Start("a green forest", fps=8.0, bucket=bucket, codec="raw"))
        st = await recv(ws)
        assert isinstance(st, Started)
        first = await frames(ws, 10, 60)
        conn = ws._conn
        assert conn is not None and conn.transport is not None
        conn.transport.abort()
        await until(lambda: s.service.store.detached_count == 1, what="the session detached")
        ws2 = await s.connect()
        await send(ws2, Resume(st.session_id, st.token, first[-1].block_idx + 1))
        resumed = await recv_type(ws2, Resumed)
        assert isinstance(resumed, Resumed) and resumed.block_idx == first[-1].block_idx + 1
        more = await frames(ws2, 10, 60)
    blocks = [f.block_idx for f in first + more]
    assert blocks == list(range(blocks[0], blocks[0] + 20))  # no gap, no repeat


async def test_unknown_session_is_missing_state_and_a_full_server_closes_1013(
    model_weights: Path,
) -> None:
    async with model_server(model_weights, capacity=1) as s:
        ws = await s.connect()
        await send(ws, Resume("no-such-session", "token", 3))
        err = await recv(ws)
        assert isinstance(err, Error) and err.code == "missing_session_state"
        await send(ws, Start("forest", fps=4.0, bucket=smallest_bucket(model_weights)))
        assert isinstance(await recv(ws), Started)
        ws2 = await s.connect()
        await send(ws2, Start("forest", fps=4.0, bucket=smallest_bucket(model_weights)))
        full = await recv(ws2)
        assert isinstance(full, Error) and full.code == "at_capacity" and full.retry_after
        closing = await ws2.receive(timeout=10)
        assert closing.type is aiohttp.WSMsgType.CLOSE and ws2.close_code == 1013
