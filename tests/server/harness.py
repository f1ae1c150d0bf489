"""A server on a loopback port for tests, and a raw protocol client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from worldserve.protocol import ClientMessage, Frame, ServerMessage, decode_server
from worldserve.server.cluster.worker import create_worker
from worldserve.server.keys import SERVICE
from worldserve.server.prompt_filter import PromptChecks
from worldserve.server.service import Service
from worldserve.server.settings import Settings
from worldserve.session.fake_runner import FakeRunner, LinearCost
from worldserve.session.plan import Runner

TEST_SETTINGS = Settings(
    port=0,
    capacity=4,
    warmup_batch_sizes=(1, 2, 4),
    detached_ttl_s=30.0,
    status_interval_s=0.5,
    admission_threshold=1e9,  # fake costs: admit everything unless a test says otherwise
)


def fake_factory(
    per_batch: float = 0.002, sleep: bool = True, frame_side: int | None = None,
) -> Callable[[Settings], Runner]:
    def make(settings: Settings) -> Runner:
        runner = FakeRunner(
            cost=LinearCost({64: (per_batch, per_batch / 4), 128: (per_batch * 2, per_batch / 2)}),
            sleep=time.sleep if sleep else None,
            frame_side=frame_side,
        )
        return runner

    return make


@dataclass
class Served:
    app: web.Application
    server: TestServer
    http: aiohttp.ClientSession

    @property
    def service(self) -> Service:
        return self.app[SERVICE]

    @property
    def ws_url(self) -> str:
        return str(self.server.make_url("/v1/ws"))

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))

    async def connect(self, **kw: object) -> aiohttp.ClientWebSocketResponse:
        return await self.http.ws_connect(self.ws_url, **kw)  # type: ignore[arg-type]


@asynccontextmanager
async def serve(
    settings: Settings = TEST_SETTINGS,
    runner_factory: Callable[[Settings], Runner] | None = None,
    *,
    ready_timeout: float = 120.0,
    prompt_checks: PromptChecks | None = None,
    **overrides: object,
) -> AsyncIterator[Served]:
    """``prompt_checks``: loaded beforehand, off the loop, where ``settings`` name a blocklist
    or a check (server/prompt_filter.py)."""
    if overrides:
        settings = replace(settings, **overrides)  # type: ignore[arg-type]
    app = create_worker(settings, runner_factory=runner_factory or fake_factory(), prompt_checks=prompt_checks)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    http = aiohttp.ClientSession()
    try:
        deadline = time.monotonic() + ready_timeout
        while not app[SERVICE].ready:
            if app[SERVICE].failure:
                raise RuntimeError(app[SERVICE].failure)
            if time.monotonic() > deadline:
                raise TimeoutError("server did not become ready")
            await asyncio.sleep(0.02)
        yield Served(app, server, http)
    finally:
        await http.close()
        await server.close()


async def send(ws: aiohttp.ClientWebSocketResponse, msg: ClientMessage) -> None:
    await ws.send_bytes(msg.encode())


async def recv(ws: aiohttp.ClientWebSocketResponse, timeout: float = 10.0) -> ServerMessage:
    msg = await ws.receive(timeout=timeout)
    if msg.type is not aiohttp.WSMsgType.BINARY:
        raise AssertionError(f"expected a binary message, got {msg.type!r} {msg.data!r} {msg.extra!r}")
    return decode_server(msg.data)


async def recv_type(
    ws: aiohttp.ClientWebSocketResponse, kind: type, timeout: float = 10.0, skip: tuple[type, ...] = (),
) -> ServerMessage:
    """The next message of type ``kind``, skipping frames, status and ``skip`` types."""
    end = time.monotonic() + timeout
    while True:
        msg = await recv(ws, max(0.01, end - time.monotonic()))
        if isinstance(msg, kind):
            return msg
        from worldserve.protocol import Degradation, Skipped, Status

        if not isinstance(msg, (Frame, Status, Degradation, Skipped, *skip)):
            raise AssertionError(f"expected {kind.__name__}, got {msg!r}")


async def frames(ws: aiohttp.ClientWebSocketResponse, n: int, timeout: float = 30.0) -> list[Frame]:
    """The next ``n`` frames (other messages skipped; errors fail)."""
    out: list[Frame] = []
    end = time.monotonic() + timeout
    while len(out) < n:
        msg = await recv(ws, max(0.01, end - time.monotonic()))
        if isinstance(msg, Frame):
            out.append(msg)
        elif msg.TYPE in ("error", "ended"):
            raise AssertionError(f"got {msg!r} while waiting for frames")
    return out
