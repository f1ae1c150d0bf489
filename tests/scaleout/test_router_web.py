"""What the router serves the browser client: the page and its files, ``/web/config``
saying ``router``, and CORS on the endpoints the page calls (a worker's too)."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from tests.scaleout.harness import cluster
from worldserve.server.cluster.directory import MemoryDirectory
from worldserve.server.cluster.router import RouterSettings, create_router


async def test_the_router_serves_the_page_and_says_it_is_a_router() -> None:
    app = create_router(RouterSettings(maintenance_s=60.0), directory=MemoryDirectory())
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        async with client.get("/") as resp:
            assert resp.status == 200 and "/web/app.js" in await resp.text()
        async with client.get("/web/app.js") as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/javascript")
        async with client.get("/web/config") as resp:
            assert resp.status == 200 and await resp.json() == {"mode": "router"}
        for path in ("/v1/place", "/v1/resume"):
            async with client.options(path, headers={"Origin": "http://elsewhere",
                                                     "Access-Control-Request-Method": "POST"}) as resp:
                assert resp.status == 204
                assert resp.headers["Access-Control-Allow-Origin"] == "*"
                assert "POST" in resp.headers["Access-Control-Allow-Methods"]
        async with client.post("/v1/place") as resp:  # no worker: 503, still readable cross-origin
            assert resp.status == 503 and resp.headers["Access-Control-Allow-Origin"] == "*"
        async with client.post("/v1/resume", json={"session_id": "abcdefgh"}) as resp:
            assert resp.status == 404 and resp.headers["Access-Control-Allow-Origin"] == "*"
        async with client.get("/metrics") as resp:  # preflights are not signaling requests
            text = await resp.text()
        assert 'endpoint="/v1/place",status="503"' in text and 'status="204"' not in text


async def test_a_worker_says_worker_and_answers_the_pages_cross_origin_calls() -> None:
    async with cluster(1) as c:
        base = c.worker_url(0)
        async with c.http.get(f"{base}/web/config") as resp:
            assert await resp.json() == {"mode": "worker"}
        async with c.http.get(f"{base}/v1/load") as resp:
            assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == "*"
        async with c.http.options(f"{base}/v1/sessions/abc", headers={
                "Origin": "http://elsewhere", "Access-Control-Request-Method": "DELETE"}) as resp:
            assert resp.status == 204 and "DELETE" in resp.headers["Access-Control-Allow-Methods"]
            assert "Authorization" in resp.headers["Access-Control-Allow-Headers"]
            assert "X-Session-Token" in resp.headers["Access-Control-Allow-Headers"]
        async with c.http.delete(f"{base}/v1/sessions/abc", headers={"X-Session-Token": "t"}) as resp:
            assert resp.status == 404 and resp.headers["Access-Control-Allow-Origin"] == "*"


async def test_the_router_s_place_needs_one_of_its_api_keys() -> None:
    settings = RouterSettings(maintenance_s=60.0, api_keys=frozenset({"router-key"}))
    app = create_router(settings, directory=MemoryDirectory())
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Bearer "},
                        {"Authorization": "router-key"}):
            async with client.post("/v1/place", headers=headers) as resp:
                assert resp.status == 401
                assert await resp.json() == {
                    "error": "unauthorized", "message": "Authorization: Bearer <api key> required"
                }
        async with client.post("/v1/place", headers={"Authorization": "Bearer router-key"}) as resp:
            assert resp.status == 503  # the key is right; there is just no worker
        async with client.post("/v1/resume", json={"session_id": "abcdefgh"}) as resp:
            assert resp.status == 404  # resume needs no key


async def test_places_faster_than_a_client_s_quota_get_429_with_retry_after() -> None:
    settings = RouterSettings(maintenance_s=60.0, quota_places_per_s=0.01, quota_place_burst=3)
    app = create_router(settings, directory=MemoryDirectory())
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        statuses = []
        for _ in range(5):
            async with client.post("/v1/place") as resp:
                statuses.append(resp.status)
                if resp.status == 429:
                    body = await resp.json()
                    assert body["error"] == "over_quota" and int(resp.headers["Retry-After"]) >= 1
        assert statuses == [503, 503, 503, 429, 429]  # no worker for the first three: charged all the same
