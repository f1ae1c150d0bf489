"""What docs/protocol.md promises, checked through a real WebSocket on a real server (the
fake runner; the last test runs the real model): the newest action always wins, a
``skipped`` goes with the late block it is about, ``started`` and ``pts_us`` tell the
settings and the clock the frames are paced by, a pull session keeps to its rate, and the
small rules (a message without ``v``, the pull request window, observation sizes)."""

from __future__ import annotations

import time
from itertools import pairwise
from pathlib import Path

import msgpack
import numpy as np

from tests.server.harness import fake_factory, frames, recv, recv_type, send, serve
from worldserve.clients.sdk import WorldClient
from worldserve.protocol import (
    Ack,
    Block,
    Degradation,
    Error,
    Frame,
    Image,
    Observation,
    Ping,
    Pong,
    ServerMessage,
    Skipped,
    Start,
    Started,
    Status,
)
from worldserve.session.scheduler import PULL_BURST


async def test_the_newest_action_of_a_burst_over_the_message_rate_reaches_the_session() -> None:
    # A game sending its state at a high rate: 1000 actions at once, far over the message
    # rate (20 at once, 50/s). Whatever the limit drops, the last one must be applied.
    async with serve(max_msgs_per_s=50.0, msg_burst=20) as s:
        async with WorldClient(s.ws_url, reconnect=False) as client:
            await client.start(codec="raw")
            for i in range(1000):
                await client.action(["forward"] if i % 2 else ["back"], (0.0, 0.0))
            limited, seq = False, 0
            end = time.monotonic() + 30.0
            while seq < 1000 and time.monotonic() < end:
                ev = await client.recv(timeout=max(0.01, end - time.monotonic()))
                if isinstance(ev, Error):
                    assert ev.code == "rate_limited", ev
                    limited = True
                elif hasattr(ev, "msg") and isinstance(ev.msg, Frame):
                    seq = ev.msg.action_seq
            assert limited, "the burst was not over the message rate: nothing was tested"
            assert seq == 1000  # the newest action, applied
            live = s.service.live(client.session_id or "")
            assert live is not None and live.action_seq == 1000


async def test_skipped_comes_once_right_before_the_late_block_and_names_a_block_sent() -> None:
    # Chunks take longer than a frame period at 24 fps (60+ ms against 41.7): display
    # slots pass without a new frame until the ladder has moved far enough.
    async with serve(runner_factory=fake_factory(per_batch=0.06)) as s:
        ws = await s.connect()
        await send(ws, Start(codec="raw", fps=24.0, lookahead=0))
        started = await recv(ws)
        assert isinstance(started, Started)
        stream: list[Frame | Skipped] = []
        end = time.monotonic() + 30.0
        while sum(isinstance(m, Frame) for m in stream) < 40 and time.monotonic() < end:
            msg = await recv(ws, max(0.01, end - time.monotonic()))
            if isinstance(msg, Frame | Skipped):
                stream.append(msg)
            else:
                assert not isinstance(msg, Error), msg
        await ws.close()
    skips = [i for i, m in enumerate(stream) if isinstance(m, Skipped)]
    assert skips, "no display slot was skipped: nothing was tested"
    shown = [m for m in stream if isinstance(m, Frame)]
    assert [f.block_idx for f in shown] == list(range(len(shown)))  # every block, once
    assert len({stream[i].block_idx for i in skips}) == len(skips)  # one skipped per block
    period_us = 1e6 / 24.0  # the ladder only lowers fps: a period is at least this long
    for i in skips:
        skip, after = stream[i], stream[i + 1] if i + 1 < len(stream) else None
        assert isinstance(skip, Skipped) and skip.frames >= 1
        # the late block itself comes next, and what the client kept showing was sent
        assert isinstance(after, Frame) and after.block_idx == skip.block_idx, stream[i : i + 2]
        before = [m for m in stream[:i] if isinstance(m, Frame)]
        assert skip.repeat_block_idx == (before[-1].block_idx if before else -1)
        if before:  # its presentation time is that many frames later
            assert after.pts_us - before[-1].pts_us >= (skip.frames + 1) * period_us - 2


async def test_a_degraded_admission_says_so_and_paces_frames_at_what_it_was_admitted_at() -> None:
    # 60 fps at full quality is over the admission threshold with these costs: the session
    # is admitted lower down its ladder (fewer steps, then a lower frame rate).
    async with serve(runner_factory=fake_factory(per_batch=0.02), admission_threshold=0.85) as s:
        ws = await s.connect()
        await send(ws, Start(codec="raw", fps=60.0))
        started = await recv(ws)
        assert isinstance(started, Started)
        assert started.level > 0 and started.fps < 60.0
        got: list[ServerMessage] = []
        end = time.monotonic() + 30.0
        while (
            not any(isinstance(m, Status) for m in got) or sum(isinstance(m, Frame) for m in got) < 12
        ) and time.monotonic() < end:
            got.append(await recv(ws, max(0.01, end - time.monotonic())))
        await ws.close()
    [said] = [m for m in got if isinstance(m, Degradation)][:1]
    assert (said.old_level, said.new_level, said.fps) == (0, started.level, started.fps)
    assert any(c.startswith("fps 60->") for c in said.changes), said.changes
    status = next(m for m in got if isinstance(m, Status))
    assert status.target_fps == started.fps
    # pts_us: the presentation time on the clock that paces the frames (skips included)
    period_us = 1e6 / started.fps
    pts = [m.pts_us for m in got if isinstance(m, Frame)]
    assert pts[0] == 0
    for a, b in pairwise(pts):
        slots = (b - a) / period_us
        assert slots >= 1 - 1e-4 and abs(slots - round(slots)) * period_us <= 2, (a, b, period_us)


async def test_a_pull_session_is_held_to_the_rate_it_declared() -> None:
    # It declares 2 fps but keeps every request it may have outstanding; blocks take 10 ms.
    fps = 2.0
    async with serve(runner_factory=fake_factory(per_batch=0.01)) as s:
        ws = await s.connect()
        await send(ws, Start(codec="raw", mode="pull", fps=fps))
        assert isinstance(await recv(ws), Started)
        t0 = time.monotonic()
        for b in range(1, s.service.settings.pull_queue):  # start's block 0 is the first
            await send(ws, Block(b))
        nxt, got = s.service.settings.pull_queue, 0
        while time.monotonic() - t0 < 2.5:
            try:
                msg = await recv(ws, 0.2)
            except TimeoutError:
                continue
            assert not isinstance(msg, Error), msg
            if isinstance(msg, Frame):
                got += 1
                await send(ws, Block(nxt))
                nxt += 1
        elapsed = time.monotonic() - t0
        await ws.close()
    # at its rate, after a burst of PULL_BURST; without the hold it got ~100 here
    assert 1 <= got <= PULL_BURST + fps * elapsed + 1, (got, elapsed)


async def test_a_message_without_a_version_is_a_bad_message_and_another_version_unsupported() -> None:
    async with serve() as s:
        ws = await s.connect()
        for wire, code in (
            ({}, "bad_message"),
            ({"type": "ping", "id": 1}, "bad_message"),
            ({"type": "ping", "v": 2, "id": 1}, "unsupported_version"),
        ):
            await ws.send_bytes(msgpack.packb(wire))
            err = await recv(ws)
            assert isinstance(err, Error) and (err.code, err.field) == (code, "v"), (wire, err)
            assert not err.fatal
        await send(ws, Ping(3))
        pong = await recv(ws)  # the connection is still served
        assert isinstance(pong, Pong) and pong.id == 3
        await ws.close()


async def test_start_asks_for_block_0_and_counts_among_the_outstanding_requests() -> None:
    async with serve(runner_factory=fake_factory(per_batch=0.2)) as s:  # block 0: 250 ms
        queue = s.service.settings.pull_queue
        ws = await s.connect()
        await send(ws, Start(codec="raw", mode="pull", fps=1.0))  # 1 fps: few blocks arrive
        started = await recv(ws)
        assert isinstance(started, Started)
        for b in range(1, queue + 1):
            await send(ws, Block(b))
        err = await recv_type(ws, Error)
        assert isinstance(err, Error) and err.code == "rate_limited" and "start" in err.message
        assert err.message.startswith(f"{queue} blocks are already outstanding")
        # blocks 1..queue-1 were accepted, the last one refused
        assert s.service.store.get(started.session_id).last_block_idx == queue - 1
        await ws.close()


async def test_observation_sides_are_limited_to_1_to_2048() -> None:
    async with serve() as s:
        ws = await s.connect()
        await send(ws, Start(codec="raw"))
        assert isinstance(await recv(ws), Started)
        too_wide = {"type": "observation", "v": 1, "id": 1, "image": {
            "format": "raw", "dtype": "uint8", "shape": [1, 2049, 3], "data": bytes(2049 * 3)}}
        await ws.send_bytes(msgpack.packb(too_wide, use_bin_type=True))
        err = await recv_type(ws, Error)
        assert isinstance(err, Error) and err.code == "bad_message"
        assert err.field == "image.shape" and "2048" in err.message
        frame = np.zeros((1, 2048, 3), np.uint8)  # the widest side allowed
        await send(ws, Observation(Image.from_array(frame, "raw"), 2))
        assert await recv_type(ws, Ack) == Ack("observation", 2)
        await ws.close()


async def test_a_raw_observation_runs_through_the_real_model_without_a_warning(model_weights: Path) -> None:
    # Raw bytes decode to a read-only array, which the runner resizes to the bucket; torch
    # warns on a read-only array (an error under this suite's warning filter: the block
    # would fail with runner_error).
    from tests.server.test_e2e_model import model_server, smallest_bucket

    bucket = smallest_bucket(model_weights)
    async with model_server(model_weights) as s:
        ws = await s.connect()
        await send(ws, Start(codec="raw", bucket=bucket, mode="pull"))
        assert isinstance(await recv(ws), Started)
        await frames(ws, 1, timeout=120.0)
        frame = np.full((2 * bucket, 2 * bucket, 3), 90, np.uint8)  # resized on the way in
        await send(ws, Observation(Image.from_array(frame, "raw"), 5))
        assert await recv_type(ws, Ack, timeout=60.0) == Ack("observation", 5)
        await send(ws, Block(1))
        [f] = await frames(ws, 1, timeout=120.0)  # fails on a runner_error
        assert f.block_idx == 1
        await ws.close()


async def test_the_sdk_counts_late_blocks_once_and_follows_the_pacing_rate() -> None:
    async with serve(runner_factory=fake_factory(per_batch=0.06)) as s:
        async with WorldClient(s.ws_url, reconnect=False) as client:
            started = await client.start(codec="raw", fps=24.0, lookahead=0)
            assert client.fps == started.fps
            blocks: list[int] = []
            said = 0
            end = time.monotonic() + 30.0
            while len(blocks) < 30 and time.monotonic() < end:
                ev = await client.recv(timeout=max(0.01, end - time.monotonic()))
                if isinstance(ev, Skipped):
                    said += ev.frames
                elif isinstance(ev, Degradation):
                    assert client.fps == ev.fps and client.level == ev.new_level
                elif hasattr(ev, "msg") and isinstance(ev.msg, Frame):
                    blocks.append(ev.msg.block_idx)
            assert blocks == list(range(len(blocks)))  # every block once, none skipped
            assert said > 0 and client.skipped_frames == said
