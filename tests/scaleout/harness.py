"""In-process clusters for the scale-out tests: workers (fake runner) and a router that
share one directory, each on its own loopback port, as separate processes would."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.server.harness import TEST_SETTINGS, fake_factory
from worldserve.server.cluster.directory import Directory, MemoryDirectory
from worldserve.server.cluster.router import RouterSettings, create_router
from worldserve.server.cluster.worker import create_worker
from worldserve.server.keys import AGENT, SERVICE
from worldserve.server.settings import Settings
from worldserve.session.plan import Runner

ADMIN_KEY = "test-admin-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_settings(i: int, port: int, **overrides: object) -> Settings:
    return replace(
        TEST_SETTINGS,
        port=port,
        advertise=f"http://127.0.0.1:{port}",
        worker_id=f"w{i}",
        admin_key=ADMIN_KEY,
        worker_heartbeat_s=0.1,
        worker_ttl_s=1.0,
        snapshot_interval_s=0.2,
        drain_timeout_s=10.0,
        **overrides,  # type: ignore[arg-type]
    )


@dataclass
class Cluster:
    directory: Directory
    workers: list[web.Application]
    servers: list[TestServer]
    router: TestServer
    http: aiohttp.ClientSession
    stopped: set[int] = field(default_factory=set)

    @property
    def router_url(self) -> str:
        return str(self.router.make_url("")).rstrip("/")

    def worker_url(self, i: int) -> str:
        return str(self.servers[i].make_url("")).rstrip("/")

    def index_of(self, worker_id: str) -> int:
        return next(i for i, app in enumerate(self.workers) if app[AGENT].worker_id == worker_id)

    async def holder(self, session_id: str) -> int:
        rec = await self.directory.get_session(session_id)
        assert rec is not None, session_id
        return self.index_of(rec.worker_id)

    async def drain(self, i: int) -> None:
        async with self.http.post(
            f"{self.worker_url(i)}/admin/drain", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        ) as resp:
            assert resp.status == 202, await resp.text()


@asynccontextmanager
async def cluster(
    n: int = 2,
    *,
    directory: Callable[[], Directory] | None = None,
    runner_factory: Callable[[Settings], Runner] | None = None,
    **overrides: object,
) -> AsyncIterator[Cluster]:
    """``n`` workers and a router; ``directory`` makes each one's directory client (a
    Redis one per process, as real processes have), else they share a MemoryDirectory.
    ``runner_factory``: the workers' runners (default: the fake runner)."""
    memory = MemoryDirectory()
    make = directory or (lambda: memory)
    shared = make()
    apps, servers = [], []
    http = aiohttp.ClientSession()
    router_server: TestServer | None = None
    try:
        for i in range(n):
            port = free_port()
            app = create_worker(worker_settings(i, port, **overrides), runner_factory=runner_factory or fake_factory(),
                                directory=make())
            server = TestServer(app, host="127.0.0.1", port=port)
            await server.start_server()
            apps.append(app)
            servers.append(server)
        secret = overrides.get("cluster_secret")
        router_settings = RouterSettings(maintenance_s=0.1, cluster_secret=secret if isinstance(secret, str) else None)
        router_app = create_router(router_settings, directory=make())
        router_server = TestServer(router_app, host="127.0.0.1")
        await router_server.start_server()
        deadline = time.monotonic() + 30
        while len([w for w in await shared.list_workers() if w.state == "serving"]) < n:
            assert time.monotonic() < deadline, "workers did not register as serving"
            assert all(not a[SERVICE].failure for a in apps)
            await asyncio.sleep(0.02)
        yield Cluster(shared, apps, servers, router_server, http)
    finally:
        await http.close()
        if router_server is not None:
            await router_server.close()
        for server in servers:
            await server.close()
        await shared.close()
