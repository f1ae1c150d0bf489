"""Typed keys of the aiohttp application's state, all in one place, and the protocols of what
the app is given (the runner factory, the cluster's agent)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from aiohttp import web

from worldserve.server.metrics import Metrics
from worldserve.server.offload import CodecPool
from worldserve.server.service import Service
from worldserve.server.settings import Settings
from worldserve.session.plan import Runner


class Closable(Protocol):
    """A live connection that shutdown must close (WebSockets now, WebRTC peers later)."""

    async def close(self, code: int = ..., reason: str = ...) -> None: ...


class Agent(Protocol):
    """This worker in a cluster (server/cluster/agent.py's ``WorkerAgent``): it joins the
    session directory when the app starts, leaves it when the app stops, and drains."""

    worker_id: str
    drained: asyncio.Event  # set once a drain has handed over or ended every session

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def begin_drain(self) -> asyncio.Task[None]:
        """Start draining (idempotent): stop admitting, hand every session over or end it."""
        ...


RunnerFactory = Callable[[Settings], Runner]
# The cluster's agent for this worker's service, made when the app is built
# (server/cluster/worker.py gives one).
AgentFactory = Callable[[Settings, Service, Metrics], Agent]

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
SERVICE = web.AppKey("service", Service)
# Every open connection registers here; on_shutdown closes them all.
CLOSABLES = web.AppKey("closables", set[Closable])
RUNNER_FACTORY: web.AppKey[RunnerFactory] = web.AppKey("runner_factory")
# This worker in the session directory; absent when the app was built without an agent.
AGENT: web.AppKey[Agent] = web.AppKey("agent")
CODECS = web.AppKey("codecs", CodecPool)  # frame encoding and image decoding, off the loop
