"""One presentation clock per epoch (docs/protocol.md, "Time"), for every model family, over a
real WebSocket on a real server: after a detach of several seconds, after a takeover of a
session that is still attached, and after a drain migrates the session to another worker,
each new frame's ``pts_us`` is one frame period after the frame before it (later only by
what a ``skipped`` announced), and a re-sent frame keeps the ``pts_us`` it had. Also: push
frames of one block go out a frame period apart, as on WebRTC; an input of a kind the model
does not take gets one ``ignored_control`` per kind, whatever the kind; ``status`` names
the last frame sent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

import tests.scaleout.harness as scaleout
from tests.model.wan.test_serve_matrix_game import mg_server, start_image
from tests.model.wan.test_serve_wan import wan_server, wan_settings
from tests.model.wan.tiny_dir import HEIGHT, build_tiny_wan_dir
from tests.model.wan.tiny_mg_dir import build_tiny_mg_dir
from tests.server.harness import Served, fake_factory, recv, send
from tests.server.test_e2e_model import model_server, smallest_bucket
from worldserve.clients.sdk import FrameEvent, WorldClient
from worldserve.protocol import (
    Action,
    Degradation,
    Error,
    ErrorCode,
    Frame,
    Image,
    Observation,
    Prompt,
    Resume,
    Resumed,
    ServerMessage,
    Skipped,
    Start,
    Started,
    Status,
)
from worldserve.server.app import load_model_runner

FAMILIES = ["default", "wan-causal", "matrix-game-2"]
Stream = list[Frame | Skipped]


class Reader:
    """One connection's messages: frames and skips in order, the rates announced, the rest."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.stream: Stream = []
        self.rates: set[float] = set()
        self.other: list[ServerMessage] = []
        self.arrived: list[float] = []  # monotonic arrival time of each frame

    async def until(self, frame: int, timeout: float = 120.0) -> None:
        """Read until a frame with index ``frame`` or later has arrived (push may drop the
        rest of a block that a late next block replaces: those indices never come)."""
        end = time.monotonic() + timeout
        while not any(isinstance(m, Frame) and m.frame >= frame for m in self.stream):
            msg = await recv(self.ws, max(0.01, end - time.monotonic()))
            if isinstance(msg, Frame):
                self.arrived.append(time.monotonic())
            if isinstance(msg, Frame | Skipped):
                self.stream.append(msg)
            elif isinstance(msg, Started | Resumed | Degradation):
                self.rates.add(msg.fps)
                self.other.append(msg)
            else:
                assert not (isinstance(msg, Error) and msg.fatal), msg
                self.other.append(msg)

    @property
    def last(self) -> Frame:
        return [m for m in self.stream if isinstance(m, Frame)][-1]


def assert_one_clock(stream: Stream, rates: set[float]) -> int:
    """Within the epoch every frame is one period after the frame before it (at a rate the
    session was told of), later by the frames a ``skipped`` right before its block named; a
    frame not sent (dropped) counts as its period all the same; a frame sent again keeps its
    ``pts_us``. Returns the newest frame index it checked."""
    periods = [1e6 / f for f in rates]
    seen: dict[int, int] = {}
    prev: Frame | None = None
    late = 0
    for m in stream:
        if isinstance(m, Skipped):
            late = m.frames
            continue
        if m.frame in seen:
            assert m.pts_us == seen[m.frame], f"frame {m.frame} re-sent at {m.pts_us}, first at {seen[m.frame]}"
            late = 0
            continue
        if prev is None:
            assert m.frame == 0 and m.pts_us == 0, m
        else:
            assert m.frame > prev.frame, f"frame {m.frame} after {prev.frame}"
            gap, frames = m.pts_us - prev.pts_us, m.frame - prev.frame + late
            assert any(abs(gap - frames * p) <= 2 for p in periods), (
                f"frame {m.frame}: pts_us {m.pts_us} is {gap} us after frame {prev.frame}, "
                f"expected {frames} periods of {sorted(periods)}"
            )
        late = 0
        seen[m.frame] = m.pts_us
        prev = m
    assert prev is not None, "no frame"
    return prev.frame


@asynccontextmanager
async def family_session(
    family: str, tmp: Path, weights: Path
) -> AsyncIterator[tuple[Served, aiohttp.ClientWebSocketResponse, Started, Reader]]:
    """A push session on a server of ``family``, started: (server, socket, started, reader)."""
    async with family_server(family, tmp, weights) as (s, start):
        ws = await s.connect()
        await send(ws, start)
        started = await recv(ws)
        assert isinstance(started, Started), started
        reader = Reader(ws)
        reader.rates.add(started.fps)
        yield s, ws, started, reader


@asynccontextmanager
async def family_server(family: str, tmp: Path, weights: Path) -> AsyncIterator[tuple[Served, Start]]:
    """A server of ``family`` (the default model, or tiny random Wan weights) and the start
    message a client of it sends (push, raw frames, one block ahead)."""
    if family == "default":
        bucket = smallest_bucket(weights)
        async with model_server(weights) as s:
            yield s, Start("a green forest", seed=3, fps=8.0, bucket=bucket, codec="raw", lookahead=1)
    elif family == "wan-causal":
        async with wan_server(build_tiny_wan_dir(tmp)) as s:
            yield s, Start("a red fox in snowy woods", seed=3, fps=16.0, bucket=HEIGHT, codec="raw")
    else:
        async with mg_server(build_tiny_mg_dir(tmp)) as s:
            image = Image.from_array(start_image(), "png")
            yield s, Start(seed=3, fps=16.0, bucket=HEIGHT, codec="raw", observation=image)


@pytest.mark.parametrize("family", FAMILIES)
async def test_pts_continue_one_period_on_after_a_long_detach_and_after_a_takeover(
    family: str, tmp_path: Path, model_weights: Path
) -> None:
    async with family_session(family, tmp_path, model_weights) as (s, ws, started, a):
        first, per = started.first_chunk_frames, started.chunk_frames

        def block_end(b: int) -> int:  # the last frame of block b
            return first - 1 + b * per

        await a.until(block_end(2))
        # the connection drops (no ``close``): detached, generation pauses for 3 s
        await ws.close()
        await asyncio.sleep(3.0)
        nxt = a.last.block_idx + 1
        ws = await s.connect()
        await send(ws, Resume(started.session_id, started.token, nxt))
        b = Reader(ws)
        b.stream, b.rates = a.stream, a.rates  # one epoch, one stream
        await b.until(block_end(nxt + 2))

        # a second connection takes the still-attached session over, one block re-sent
        again = b.last.block_idx
        token = next(m.token for m in b.other if isinstance(m, Resumed))  # each resume gives a new one
        ws2 = await s.connect()
        await send(ws2, Resume(started.session_id, token or started.token, again))
        c = Reader(ws2)
        c.stream, c.rates = b.stream, b.rates
        await c.until(block_end(again + 3))
        assert any(isinstance(m, Resumed) and m.replayed >= 1 for m in c.other), c.other
        await ws2.close()
        await ws.close()
    assert assert_one_clock(c.stream, c.rates) >= block_end(again + 3)


@pytest.mark.parametrize("runner", ["late", "wan-causal"])
@pytest.mark.parametrize("mode", ["push", "pull"])
async def test_pts_continue_one_period_on_after_a_drain_migrates_the_session(
    runner: str, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings: dict[str, object] = {}
    if runner == "late":  # chunks slower than a frame period: push skips slots before the drain
        monkeypatch.setattr(scaleout, "fake_factory", lambda: fake_factory(per_batch=0.08))
    else:
        monkeypatch.setattr(scaleout, "fake_factory", lambda: load_model_runner)
        settings = wan_settings(build_tiny_wan_dir(tmp_path))
        settings.pop("capacity")
    async with scaleout.cluster(2, **settings) as c:
        client = WorldClient(router=c.router_url, http=c.http)
        stream: Stream = []
        rates: set[float] = set()
        try:
            started = await client.start("a harbour at dusk", seed=2, fps=16.0, bucket=HEIGHT if settings else 64,
                                         codec="raw", mode=mode)  # type: ignore[arg-type]
            rates.add(started.fps)

            async def read(upto_block: int) -> None:
                while not any(isinstance(m, Frame) and m.block_idx >= upto_block for m in stream):
                    if mode == "pull":
                        want = (max((m.block_idx for m in stream if isinstance(m, Frame)), default=0) + 1)
                        if want > client._requested:
                            await client.request(want)
                    ev = await client.recv(30)
                    if isinstance(ev, FrameEvent):
                        stream.append(ev.msg)
                    elif isinstance(ev, Skipped):
                        stream.append(ev)
                    elif isinstance(ev, Degradation | Resumed):
                        rates.add(ev.fps)

            await read(3)
            if runner == "late" and mode == "push":
                assert any(isinstance(m, Skipped) for m in stream), "nothing was late: nothing was tested"
            src = await c.holder(client.session_id or "")
            await c.drain(src)
            await read(8)
            assert client.migrations == 1
            assert await c.holder(client.session_id or "") == 1 - src
        finally:
            await client.close()
    frames = [m for m in stream if isinstance(m, Frame)]
    whole = [m for m in stream if not isinstance(m, Frame) or m.frame <= frames[-1].frame]
    # the last block may be partly read: check every frame up to the newest
    assert assert_one_clock(whole, rates) >= 8


async def test_push_frames_of_one_block_go_out_a_frame_period_apart(tmp_path: Path) -> None:
    # 8 frames a block at 4 fps: a block's frames span 1.75 s of presentation time
    async with wan_server(build_tiny_wan_dir(tmp_path)) as s:
        ws = await s.connect()
        await send(ws, Start("rain on a window", fps=4.0, bucket=HEIGHT, codec="raw", lookahead=0))
        started = await recv(ws)
        assert isinstance(started, Started)
        r = Reader(ws)
        r.rates.add(started.fps)
        first, per = started.first_chunk_frames, started.chunk_frames
        await r.until(first + per - 1)  # blocks 0 and 1
        await ws.close()
    frames = [m for m in r.stream if isinstance(m, Frame)]
    block1 = [t for t, f in zip(r.arrived, frames, strict=True) if f.block_idx == 1]
    assert len(block1) == per
    # paced, not one burst: the last frame of the block comes at least half the block's
    # presentation span after its first (a burst arrives within milliseconds)
    assert block1[-1] - block1[0] >= 0.5 * (per - 1) / started.fps, block1
    assert assert_one_clock(r.stream, r.rates) == first + per - 1


def ignored(msgs: list[ServerMessage]) -> list[str | None]:
    return [m.field for m in msgs if isinstance(m, Error) and m.code == ErrorCode.IGNORED_CONTROL]


@pytest.mark.parametrize("family", ["wan-causal", "matrix-game-2"])
async def test_each_input_kind_a_model_does_not_take_gets_one_ignored_control(
    family: str, tmp_path: Path, model_weights: Path
) -> None:
    async with family_session(family, tmp_path, model_weights) as (_, ws, started, r):
        not_taken = [k for k in ("keys", "mouse", "prompt", "observation") if k not in started.controls]
        assert not_taken, started.controls
        image = Image.from_array(start_image()[:HEIGHT], "png")
        for i in range(2):  # twice each: told once
            await send(ws, Action(seq=2 * i + 1, keys=("forward",)))
            await send(ws, Action(seq=2 * i + 2, mouse=(0.3, 0.0)))
            await send(ws, Prompt("a snowy street", id=i))
            await send(ws, Observation(image, id=10 + i))
            if i == 0:  # prompts and observations: about one a chunk period (docs/protocol.md)
                await r.until((r.last.frame if r.stream else 0) + 3 * started.chunk_frames)
        await r.until(started.first_chunk_frames + 2 * started.chunk_frames - 1)
        acks = lambda: [m for m in r.other if m.TYPE == "ack"]  # noqa: E731
        newest = lambda: max(m.action_seq for m in r.stream if isinstance(m, Frame))  # noqa: E731
        end = time.monotonic() + 120  # a loaded machine: generous, never a measurement
        while (len(acks()) < 4 or newest() < 4) and time.monotonic() < end:
            await r.until(r.last.frame + 1)
        assert sorted(ignored(r.other)) == sorted(not_taken)  # once per kind, named by field
        assert sorted((m.of, m.id) for m in acks()) == [  # type: ignore[attr-defined]
            ("observation", 10), ("observation", 11), ("prompt", 0), ("prompt", 1)]
        # frames report the newest action applied to the block that made them, and every
        # family counts the ignored ones too
        assert newest() == 4
        statuses = [m for m in r.other if isinstance(m, Status) and m.frame is not None]
        assert statuses and all(st.frame is not None and st.action_seq is not None for st in statuses)
        await ws.close()


def test_the_clock_check_fails_a_jump_and_a_step_back() -> None:
    period = 1e6 / 16
    ok = [Frame("s", b, b, round(b * period), 0, "raw", 1, 1, b"\0\0\0", True, 0.0, 0.0) for b in range(4)]
    assert assert_one_clock(ok, {16.0}) == 3
    jump = [*ok, Frame("s", 4, 4, round(4 * period) + 2_720_000, 0, "raw", 1, 1, b"\0\0\0", True, 0.0, 0.0)]
    back = [*ok, Frame("s", 4, 4, round(4 * period) - 60_000, 0, "raw", 1, 1, b"\0\0\0", True, 0.0, 0.0)]
    for bad in (jump, back):
        with pytest.raises(AssertionError):
            assert_one_clock(bad, {16.0})
    late = [*ok, Skipped(4, 3, 2), Frame("s", 4, 4, round(6 * period), 0, "raw", 1, 1, b"\0\0\0", True, 0.0, 0.0)]
    assert assert_one_clock(late, {16.0}) == 4
    dropped = [*ok[:2], ok[3]]  # frame 2 never sent: frame 3 is two periods after frame 1
    assert assert_one_clock(dropped, {16.0}) == 3
