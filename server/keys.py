"""Typed keys of the aiohttp application's state, all in one place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from aiohttp import web

from worldserve.server.cluster.agent import WorkerAgent
from worldserve.server.metrics import Metrics
from worldserve.server.offload import CodecPool
from worldserve.server.service import Service
from worldserve.server.settings import Settings
from worldserve.session.plan import Runner


class Closable(Protocol):
    """A live connection that shutdown must close (WebSockets now, WebRTC peers later)."""

    async def close(self, code: int = ..., reason: str = ...) -> None: ...


RunnerFactory = Callable[[Settings], Runner]

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
SERVICE = web.AppKey("service", Service)
# Every open connection registers here; on_shutdown closes them all.
CLOSABLES = web.AppKey("closables", set[Closable])
RUNNER_FACTORY: web.AppKey[RunnerFactory] = web.AppKey("runner_factory")
AGENT = web.AppKey("agent", WorkerAgent)  # this worker in the session directory
CODECS = web.AppKey("codecs", CodecPool)  # frame encoding and image decoding, off the loop
