"""What abusive or unlucky clients cost a worker: memory, other users' sessions, frames, work.

    python -m bench.abuse [--stream-s 60] [--burst 8] [--spam-s 10] [--bad-resumes 200]

Loopback only, bounded in count and time: every server and client runs in this process on
127.0.0.1 ports, on the fake runner (session/fake_runner.py, a chunk costs model-thread time
as a sleep), so what is measured is the server, not a model. Four parts:

- ``rss_growth_mib``: one client streams 1024x1024 solid-colour PNG observations (a few KB on
  the wire, 3 MiB decoded) as fast as the server answers, for ``--stream-s`` seconds; the
  growth of this process's resident memory from just before to its peak during the stream
  (the goal: within 200 MiB).
- ``reconnect_survived``: two users start and drop (their sessions wait, detached, to be
  resumed); then ``--burst`` clients start at once against the worker, whose model the
  first of them fill; the users then resume. The count of users whose resume succeeds
  (the goal: all of them).
- ``other_miss_delta``: three sessions stream at 24 fps; their share of display frames
  skipped over ``--spam-s`` seconds, with a fourth session sending prompts as fast as the
  server lets it, less the share over as long without it (the goal: within 0.01).
- ``handoffs_fetched_bad_token``: two workers share a directory; a session is handed from
  one to the other by a drain, then ``--bad-resumes`` resumes with wrong tokens reach the
  one it went to. The hand-off reads from the directory they cause (the goal: 0).

The last line:

    abuse rss_growth_mib=.. reconnect_survived=../.. other_miss_delta=.. handoffs_fetched_bad_token=..
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web
from aiohttp.test_utils import TestServer
from PIL import Image as PILImage

from worldserve.protocol import (
    Ack,
    Error,
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
    decode_server,
)
from worldserve.server.cluster.directory import MemoryDirectory, SessionState
from worldserve.server.cluster.worker import create_worker
from worldserve.server.keys import AGENT, SERVICE
from worldserve.server.service import Service
from worldserve.server.settings import Settings
from worldserve.session.fake_runner import FakeRunner, LinearCost

HOST = "127.0.0.1"  # loopback only
ADMIN = "abuse-bench-admin"
BASE = Settings(port=0, capacity=8, warmup_batch_sizes=(1, 2, 4), detached_ttl_s=60.0, admin_key=ADMIN)


def _runner(per_chunk: float) -> Any:
    def make(settings: Settings) -> FakeRunner:
        cost = LinearCost({64: (per_chunk, per_chunk / 4), 128: (per_chunk * 2, per_chunk / 2)})
        return FakeRunner(cost=cost, sleep=time.sleep)

    return make


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class Worker:
    app: web.Application
    url: str  # its WebSocket

    @property
    def service(self) -> Service:
        return self.app[SERVICE]


@asynccontextmanager
async def _worker(settings: Settings, per_chunk: float = 0.002, **kw: Any) -> AsyncIterator[Worker]:
    app = create_worker(settings, runner_factory=_runner(per_chunk), **kw)
    server = TestServer(app, host=HOST, port=settings.port or _free_port())
    await server.start_server()
    try:
        end = time.monotonic() + 60
        while not app[SERVICE].ready:
            if time.monotonic() > end or app[SERVICE].failure:
                raise RuntimeError(f"worker not ready: {app[SERVICE].failure}")
            await asyncio.sleep(0.02)
        yield Worker(app, str(server.make_url("/v1/ws")))
    finally:
        await server.close()


async def _recv(ws: aiohttp.ClientWebSocketResponse, timeout: float = 10.0) -> ServerMessage:
    msg = await ws.receive(timeout=timeout)
    if msg.type is not aiohttp.WSMsgType.BINARY:
        raise ConnectionError(f"socket closed ({ws.close_code})")
    return decode_server(msg.data)


async def _answer(ws: aiohttp.ClientWebSocketResponse, kinds: tuple[type, ...]) -> ServerMessage:
    while True:
        msg = await _recv(ws)
        if isinstance(msg, kinds):
            return msg


async def _ask(ws: aiohttp.ClientWebSocketResponse, msg: Observation | Prompt) -> None:
    """Send as fast as the server answers; over the connection's message rate a message is
    dropped unanswered, so wait at most half a second."""
    await ws.send_bytes(msg.encode())
    with suppress(TimeoutError):
        await asyncio.wait_for(_answer(ws, (Ack, Error)), 0.5)


async def _start(http: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[Any, ServerMessage]:
    ws = await http.ws_connect(url)
    await ws.send_bytes(Start(**kw).encode())
    return ws, await _answer(ws, (Started, Error))


async def rss_growth(http: aiohttp.ClientSession, seconds: float) -> float:
    buf = io.BytesIO()
    PILImage.fromarray(np.full((1024, 1024, 3), 90, np.uint8)).save(buf, "PNG")
    image = Image("png", buf.getvalue())
    async with _worker(BASE) as app:
        ws, started = await _start(http, app.url, fps=24.0, codec="raw")
        assert isinstance(started, Started), started
        before = peak = _rss_mib()
        end, i = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            i += 1
            await _ask(ws, Observation(image, id=i))
            peak = max(peak, _rss_mib())
        await ws.close()
    return peak - before


async def reconnect_survival(http: aiohttp.ClientSession, burst: int) -> tuple[int, int]:
    # capacity 4 and a model that one session at 12 fps fills: the users start one after the
    # other (each away before the next), the first of the crowd fills the model
    settings = replace(BASE, capacity=4, admission_threshold=0.85, batching=False)
    async with _worker(settings, per_chunk=0.06) as app:
        away = []
        for _ in range(2):
            ws, st = await _start(http, app.url, fps=12.0, bucket=64, codec="raw")
            assert isinstance(st, Started), st
            away.append(st)
            await ws.close()
            while app.service.gate.scheduled(st.session_id):  # detached: out of the engine
                await asyncio.sleep(0.02)
        crowd = await asyncio.gather(*(_start(http, app.url, fps=60.0, bucket=128, codec="raw")
                                       for _ in range(burst)))
        for ws, _ in crowd:
            await ws.close()
        while any(app.service.gate.scheduled(sid) for sid in app.service.sessions()):  # the crowd gone
            await asyncio.sleep(0.02)
        survived = 0
        for st in away:
            ws = await http.ws_connect(app.url)
            await ws.send_bytes(Resume(st.session_id, st.token, 1).encode())
            survived += isinstance(await _answer(ws, (Resumed, Error)), Resumed)
            await ws.close()  # dropped again: the model holds one of them at a time
            while app.service.gate.scheduled(st.session_id):
                await asyncio.sleep(0.02)
    return survived, len(away)


async def _skipped_share(wss: list[Any], seconds: float) -> float:
    frames = skipped = 0

    async def read(ws: Any) -> None:
        nonlocal frames, skipped
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            msg = await _recv(ws)
            if isinstance(msg, Frame):
                frames += 1
            elif isinstance(msg, Skipped):
                skipped += msg.frames

    await asyncio.gather(*(read(ws) for ws in wss))
    return skipped / max(1, frames + skipped)


async def other_miss_delta(http: aiohttp.ClientSession, seconds: float) -> float:
    async with _worker(BASE, per_chunk=0.004) as app:
        others = []
        for _ in range(3):
            ws, st = await _start(http, app.url, fps=24.0, bucket=64, codec="raw")
            assert isinstance(st, Started), st
            others.append(ws)
        await _skipped_share(others, 2.0)  # settle
        quiet = await _skipped_share(others, seconds)
        spammer, st = await _start(http, app.url, fps=24.0, bucket=64, codec="raw")
        assert isinstance(st, Started), st
        spamming = True

        async def spam() -> None:
            i = 0
            while spamming:
                i += 1
                await _ask(spammer, Prompt(f"a scene number {i}", id=i))

        task = asyncio.create_task(spam())
        loud = await _skipped_share(others, seconds)
        spamming = False
        await task
        for ws in [*others, spammer]:
            await ws.close()
    return loud - quiet


async def bad_token_fetches(http: aiohttp.ClientSession, attempts: int) -> int:
    directory = MemoryDirectory()
    ports = [_free_port(), _free_port()]
    settings = [replace(BASE, port=p, advertise=f"http://{HOST}:{p}", worker_id=f"w{i}", worker_heartbeat_s=0.1,
                        worker_ttl_s=1.0, snapshot_interval_s=0.2) for i, p in enumerate(ports)]
    async with _worker(settings[0], directory=directory) as a, _worker(settings[1], directory=directory) as b:
        while len([w for w in await directory.list_workers() if w.state == "serving"]) < 2:
            await asyncio.sleep(0.02)
        sid = "abuse-bench-sid1"
        await directory.place_session(sid, 1.0, reserve_s=30.0)  # as a router reserves it
        rec = await directory.get_session(sid)
        assert rec is not None
        source, target = (a, b) if rec.worker_id == "w0" else (b, a)
        ws, st = await _start(http, source.url, session_id=sid, fps=24.0, codec="raw")
        assert isinstance(st, Started), st
        await ws.close()
        source.app[AGENT].begin_drain()
        while True:
            rec = await directory.get_session(sid)
            if rec is not None and rec.state is SessionState.MIGRATING and rec.worker_id == target.app[AGENT].worker_id:
                break
            await asyncio.sleep(0.02)
        fetched = 0
        get_snapshot = directory.get_snapshot

        async def counting(session_id: str) -> bytes | None:
            nonlocal fetched
            fetched += 1
            return await get_snapshot(session_id)

        directory.get_snapshot = counting  # type: ignore[method-assign]
        for i in range(attempts):
            ws = await http.ws_connect(target.url)
            await ws.send_bytes(Resume(sid, f"wrong-token-{i}", 1).encode())
            await _answer(ws, (Resumed, Error))
            await ws.close()
    return fetched


async def run(args: argparse.Namespace) -> None:
    async with aiohttp.ClientSession() as http:
        rss = await rss_growth(http, args.stream_s)
        print(f"stream {args.stream_s:g} s of 1024x1024 observations: rss_growth_mib={rss:.1f}", flush=True)
        survived, users = await reconnect_survival(http, args.burst)
        print(f"burst of {args.burst} starts: {survived} of {users} reconnecting users resumed", flush=True)
        delta = await other_miss_delta(http, args.spam_s)
        print(f"prompt spam for {args.spam_s:g} s: other sessions' skipped share changed by {delta:+.4f}", flush=True)
        fetched = await bad_token_fetches(http, args.bad_resumes)
        print(f"{args.bad_resumes} resumes with wrong tokens: {fetched} hand-off reads", flush=True)
    print(f"abuse rss_growth_mib={rss:.1f} reconnect_survived={survived}/{users} "
          f"other_miss_delta={delta:+.4f} handoffs_fetched_bad_token={fetched}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stream-s", type=float, default=60.0, help="seconds of observation streaming (at most 600)")
    ap.add_argument("--burst", type=int, default=8, help="starts in the burst (at most 64)")
    ap.add_argument("--spam-s", type=float, default=10.0, help="seconds of each miss window (at most 120)")
    ap.add_argument("--bad-resumes", type=int, default=200, help="resumes with wrong tokens (at most 1000)")
    args = ap.parse_args(argv)
    if not (0 < args.stream_s <= 600 and 1 <= args.burst <= 64 and 0 < args.spam_s <= 120
            and 1 <= args.bad_resumes <= 1000):
        ap.error("out of bounds: --stream-s (0, 600], --burst [1, 64], --spam-s (0, 120], --bad-resumes [1, 1000]")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
