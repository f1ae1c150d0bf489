"""The router's /metrics: placements, resume lookups, signaling requests, directory errors
and live workers by state, driven through its aiohttp app over a directory in memory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from tests.directory.conftest import FakeClock
from worldserve.server.cluster.directory import (
    DirectoryUnavailable,
    MemoryDirectory,
    SessionRecord,
    WorkerInfo,
    WorkerState,
)
from worldserve.server.cluster.router import RouterSettings, create_router


class FlakyDirectory(MemoryDirectory):
    """A directory in memory that can be switched off, as a Redis outage would."""

    down = False

    def _check(self) -> None:
        if self.down:
            raise DirectoryUnavailable("switched off by the test")

    async def place_session(self, session_id: str, threshold: float, **kwargs: Any) -> WorkerInfo:
        self._check()
        return await super().place_session(session_id, threshold, **kwargs)

    async def get_session(self, session_id: str) -> SessionRecord | None:
        self._check()
        return await super().get_session(session_id)

    async def list_workers(self) -> list[WorkerInfo]:
        self._check()
        return await super().list_workers()


@asynccontextmanager
async def router_client(directory: MemoryDirectory) -> AsyncIterator[TestClient]:
    app = create_router(RouterSettings(maintenance_s=60.0), directory=directory)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield client


async def scrape(client: TestClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    async with client.get("/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await resp.text()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


async def test_the_router_counts_placements_resumes_requests_and_workers() -> None:
    clock = FakeClock()
    d = MemoryDirectory(clock=clock)
    await d.register_worker(WorkerInfo("a", "http://a:1", WorkerState.SERVING, 1), 3.0)
    await d.register_worker(WorkerInfo("b", "http://b:1", WorkerState.STARTING, 1), 3.0)
    async with router_client(d) as client:
        m = await scrape(client)
        assert value(m, "worldserve_router_workers", state="serving") == 1
        assert value(m, "worldserve_router_workers", state="starting") == 1
        assert value(m, "worldserve_router_workers", state="draining") == 0
        assert value(m, "worldserve_router_directory_up") == 1
        for outcome in ("placed", "refused", "failed"):  # reported from the start
            assert value(m, "worldserve_router_placements_total", outcome=outcome) == 0
        assert value(m, "process_resident_memory_bytes") is not None

        async with client.post("/v1/place") as resp:
            assert resp.status == 200
            sid = (await resp.json())["session_id"]
        async with client.post("/v1/place") as resp:  # a is full, b is not serving yet
            assert resp.status == 503
        async with client.get("/v1/place") as resp:
            assert resp.status == 405
        async with client.post("/v1/resume", json={"session_id": sid}) as resp:
            assert resp.status == 200 and (await resp.json())["worker_id"] == "a"
        async with client.post("/v1/resume", json={"session_id": "never-seen"}) as resp:
            assert resp.status == 404
        async with client.post("/v1/resume", data=b"not json") as resp:
            assert resp.status == 400
        # a dies (b serves and heartbeats); the session has a checkpoint: placed on b.
        await d.heartbeat("b", 0, 0.0, WorkerState.SERVING, 3.0)
        clock.advance(2.0)
        await d.heartbeat("b", 0, 0.0, WorkerState.SERVING, 3.0)
        clock.advance(2.0)
        await d.put_snapshot(sid, b"checkpoint", 60.0)
        async with client.post("/v1/resume", json={"session_id": sid}) as resp:
            assert resp.status == 200 and (await resp.json())["worker_id"] == "b"
        async with client.get("/v1/workers") as resp:
            assert resp.status == 200

        m = await scrape(client)
    placements = {o: value(m, "worldserve_router_placements_total", outcome=o)
                  for o in ("placed", "refused", "failed")}
    assert placements == {"placed": 1, "refused": 1, "failed": 0}
    resumes = {o: value(m, "worldserve_router_resumes_total", outcome=o)
               for o in ("found", "re_placed", "missing", "bad_request", "refused", "failed")}
    assert resumes == {"found": 1, "re_placed": 1, "missing": 1, "bad_request": 1,
                       "refused": 0, "failed": 0}
    requests = {
        (dict(labels)["endpoint"], dict(labels)["status"]): v
        for (name, labels), v in m.items() if name == "worldserve_router_requests_total"
    }
    assert requests == {
        ("/v1/place", "200"): 1, ("/v1/place", "503"): 1, ("/v1/place", "405"): 1,
        ("/v1/resume", "200"): 2, ("/v1/resume", "404"): 1, ("/v1/resume", "400"): 1,
        ("/v1/workers", "200"): 1,
    }
    assert value(m, "worldserve_router_workers", state="serving") == 1  # b; a is gone
    assert value(m, "worldserve_router_workers", state="starting") == 0
    assert not [k for k in m if k[0] == "worldserve_router_directory_errors_total"]


async def test_the_router_counts_directory_errors_and_reports_the_directory_down() -> None:
    d = FlakyDirectory()
    await d.register_worker(WorkerInfo("a", "http://a:1", WorkerState.SERVING, 4), 30.0)
    async with router_client(d) as client:
        assert value(await scrape(client), "worldserve_router_workers", state="serving") == 1
        d.down = True
        async with client.post("/v1/place") as resp:
            assert resp.status == 503 and (await resp.json())["error"] == "directory_unavailable"
        async with client.post("/v1/resume", json={"session_id": "s1"}) as resp:
            assert resp.status == 503
        async with client.get("/v1/workers") as resp:
            assert resp.status == 503
        async with client.get("/readyz") as resp:
            assert resp.status == 503
        m = await scrape(client)
        assert value(m, "worldserve_router_directory_up") == 0
        assert not [k for k in m if k[0] == "worldserve_router_workers"]  # unknown: absent
        errors = {dict(labels)["operation"]: v for (name, labels), v in m.items()
                  if name == "worldserve_router_directory_errors_total"}
        assert errors == {"place": 1, "resume": 1, "workers": 1, "readyz": 1, "metrics": 1}
        assert value(m, "worldserve_router_placements_total", outcome="failed") == 1
        assert value(m, "worldserve_router_resumes_total", outcome="failed") == 1
        assert value(m, "worldserve_router_requests_total",
                     endpoint="/v1/place", status="503") == 1

        d.down = False  # back: the gauges come back with it
        m = await scrape(client)
        assert value(m, "worldserve_router_directory_up") == 1
        assert value(m, "worldserve_router_workers", state="serving") == 1
