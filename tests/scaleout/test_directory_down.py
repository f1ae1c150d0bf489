"""Redis unreachable: the embedded mode does not care; a multi-worker deployment refuses
new sessions with a clear error (never places one nobody could find) and keeps serving
the sessions it has."""

from __future__ import annotations

import uuid
from dataclasses import replace

import aiohttp
from aiohttp.test_utils import TestServer

from tests.polling import until
from tests.scaleout.harness import cluster, worker_settings
from tests.server.harness import recv_type, send, serve
from worldserve.clients.local import RedisProcess, free_port
from worldserve.clients.sdk import WorldClient
from worldserve.protocol import CloseCode, Error, Start
from worldserve.server.cluster.directory.redis import RedisDirectory
from worldserve.server.cluster.router import RouterSettings, create_router


def dead_redis() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there


async def test_a_worker_without_its_directory_is_unready_and_refuses_starts() -> None:
    settings = replace(worker_settings(0, 0), directory_url=dead_redis())
    async with serve(settings) as s:
        # the first heartbeat finds the directory down
        await until(lambda: s.service.remote is not None and s.service.remote.unhealthy(),
                    what="the directory found down")
        async with s.http.get(s.url("/readyz")) as resp:
            body = await resp.json()
            assert resp.status == 503 and body["reason"].startswith("directory unavailable")
            assert "127.0.0.1" not in body["reason"] and "redis" not in body["reason"]  # no address for clients
        ws = await s.connect()
        await send(ws, Start(session_id="reserved-1"))
        err = await recv_type(ws, Error)
        assert isinstance(err, Error) and err.code == "directory_unavailable" and err.fatal
        assert "127.0.0.1" not in err.message
        assert err.retry_after is not None and err.retry_after > 0
        closed = await ws.receive(5)
        assert closed.type is aiohttp.WSMsgType.CLOSE and closed.data == CloseCode.TRY_AGAIN


async def test_a_router_without_its_directory_answers_503_with_retry_after() -> None:
    app = create_router(RouterSettings(directory_url=dead_redis()))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(server.make_url("/v1/place")) as resp:
                body = await resp.json()
                assert resp.status == 503 and body["error"] == "directory_unavailable"
                assert body["retry_after"] > 0 and resp.headers["Retry-After"] == "1"
            async with http.get(server.make_url("/readyz")) as resp:
                assert resp.status == 503
    finally:
        await server.close()


async def test_losing_redis_keeps_running_sessions_and_refuses_new_ones(
    own_redis: RedisProcess,
) -> None:
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    async with cluster(2, directory=lambda: RedisDirectory(own_redis.url, prefix)) as c:
        async with WorldClient(router=c.router_url, http=c.http) as client:
            await client.start(fps=30.0, codec="raw")
            before = [(await client.next_frame(5)).block_idx for _ in range(3)]
            async with c.http.post(f"{c.router_url}/v1/place") as resp:
                reserved = await resp.json()
            own_redis.proc.kill()
            after = [(await client.next_frame(5)).block_idx for _ in range(20)]  # ~0.7 s
            assert before + after == list(range(23))
            async with c.http.ws_connect(reserved["url"]) as ws:
                await send(ws, Start(session_id=reserved["session_id"]))
                err = await recv_type(ws, Error)
                assert isinstance(err, Error) and err.code == "directory_unavailable"
            async with c.http.get(f"{c.worker_url(0)}/readyz") as resp:
                assert resp.status == 503
                assert (await resp.json())["reason"].startswith("directory unavailable")
            async with c.http.post(f"{c.router_url}/v1/place") as resp:
                assert resp.status == 503
            assert (await client.next_frame(5)).block_idx == 23  # still streaming
