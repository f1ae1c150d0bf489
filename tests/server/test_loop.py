"""The event loop is never blocked: codec work runs on the codec pool (server/offload.py),
in order, and the loop guard (tests/server/loop_guard.py) catches a blocking call."""

from __future__ import annotations

import asyncio
import io
import threading
import time

import av
import numpy as np
import pytest
from PIL import Image as PILImage

from tests.server.harness import fake_factory, frames, recv, recv_type, send, serve
from tests.server.loop_guard import BlockingError, LoopGuard
from worldserve.bench.encode_cost import ws_ms
from worldserve.protocol import (
    Ack,
    Error,
    Frame,
    Image,
    Observation,
    Ping,
    Pong,
    Prompt,
    Start,
    Started,
)
from worldserve.server.encode import make_encoder
from worldserve.server.offload import CodecPool
from worldserve.server.ws import _timed_encode


def _caught(guard: LoopGuard) -> list[str]:
    """The calls the guard caught (names only), forgotten so that the test can pass."""
    return [c.split(" from ")[0] for c in guard.take()]


async def test_a_blocking_call_in_a_handler_is_caught_even_when_the_server_answers(
    blockbuster: LoopGuard, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve() as s:

        def slow_readiness() -> tuple[bool, str]:
            time.sleep(0.001)
            return True, "ready"

        monkeypatch.setattr(s.service, "readiness", slow_readiness)
        async with s.http.get(s.url("/readyz")) as r:
            assert r.status == 500  # the handler raised; aiohttp answered for it
        caught = blockbuster.take()
    assert len(caught) == 1 and caught[0].startswith("time.sleep from server/http_api.py:")
    assert caught[0].endswith(" readyz")


async def test_codec_work_is_caught_on_the_loop_and_allowed_off_it(blockbuster: LoopGuard) -> None:
    with pytest.raises(BlockingError, match=r"JpegEncoder\.encode"):
        _timed_encode(make_encoder("jpeg"), np.zeros((64, 64, 3), np.uint8), 0, True)  # the writer's call
    assert _caught(blockbuster) == ["worldserve.server.encode.JpegEncoder.encode"]
    assert await asyncio.to_thread(ws_ms, "h264", 64, 2) > 0
    assert await asyncio.to_thread(ws_ms, "jpeg", 64, 2) > 0
    assert blockbuster.take() == []


@pytest.mark.parametrize("codec", ["jpeg", "h264"])
async def test_frames_are_encoded_off_the_loop_and_go_out_in_order(codec: str) -> None:
    # An encode on the loop would be caught by the guard (CODEC_CALLS) and fail this test.
    async with serve(runner_factory=fake_factory(frame_side=None)) as s:
        ws = await s.connect()
        await send(ws, Start(codec=codec, fps=60.0, bucket=64))  # type: ignore[arg-type]
        assert isinstance(await recv_type(ws, Started), Started)
        got = await frames(ws, 30)
        await ws.close()
    indices = [f.frame for f in got]
    assert indices == sorted(indices) and len(set(indices)) == len(indices)
    if codec == "jpeg":
        for f in got:
            with PILImage.open(io.BytesIO(f.data)) as im:
                assert im.size == (64, 64)
    else:  # one H.264 stream: every frame decodes, so the encoder's state was never shared
        assert got[0].key
        dec = av.CodecContext.create("h264", "r")
        decoded = [fr for f in got for fr in dec.decode(av.Packet(f.data))]  # one access unit each
        decoded += dec.decode(None)
        assert len(decoded) == len(got) and all((fr.width, fr.height) == (64, 64) for fr in decoded)


def _png(side: int, seed: int = 0) -> Image:
    rng = np.random.default_rng(seed)
    return Image.from_array(rng.integers(0, 256, (side, side, 3), dtype=np.uint8), "png")


async def test_an_observation_is_decoded_off_the_loop_and_keeps_its_place_in_line() -> None:
    big = _png(512)  # a few ms of decoding: the prompt and ping behind it must wait for it
    async with serve(input_burst=3) as s:  # three costly inputs at once (docs/protocol.md)
        ws = await s.connect()
        await send(ws, Start(fps=20.0, observation=_png(64, 1)))  # decoded off the loop too
        assert isinstance(await recv_type(ws, Started), Started)
        await send(ws, Observation(big, id=1))
        await send(ws, Prompt("a desert", id=2))
        await send(ws, Ping(3))
        replies = []
        while len(replies) < 3:
            msg = await recv(ws)
            if isinstance(msg, Ack | Pong):
                replies.append(msg)
            else:
                assert isinstance(msg, Frame) or msg.TYPE in ("status", "degradation"), msg
        assert replies[:2] == [Ack("observation", 1), Ack("prompt", 2)]
        assert isinstance(replies[2], Pong) and replies[2].id == 3
        await send(ws, Observation(Image("png", b"\x89PNG, not really"), id=4))
        err = await recv_type(ws, Error)
        assert isinstance(err, Error) and err.field == "image.data" and not err.fatal


async def test_the_codec_pool_runs_only_while_open_and_close_waits_for_its_jobs() -> None:
    with pytest.raises(ValueError, match="workers must be >= 1"):
        CodecPool(0)
    pool = CodecPool(2)
    with pytest.raises(RuntimeError, match="not open"):
        await pool.run(int, "1")
    pool.open()
    assert await pool.run(int, "7", base=8) == 7
    names = await asyncio.gather(*(pool.run(lambda: threading.current_thread().name) for _ in range(4)))
    assert all(n.startswith("worldserve-codec") for n in names)
    done: list[int] = []
    slow = asyncio.ensure_future(pool.run(lambda: (time.sleep(0.05), done.append(1))))
    await asyncio.sleep(0)
    await pool.close()
    assert done == [1] and not pool.is_open
    await slow
    with pytest.raises(RuntimeError, match="not open"):
        await pool.run(int, "1")
