"""The browser client served by a router: two in-process workers (fake runner) and a
router sharing a directory in memory (tests/scaleout/harness.py), headless Chromium.

The page learns from ``GET /web/config`` that a router served it, places its session
with ``POST /v1/place``, opens it at the worker named (a cross-origin WebRTC offer or
WebSocket carrying the reservation), follows a drain's ``migrate`` to the other worker,
asks the router (``POST /v1/resume``) when a ``migrate`` has no target, and sends its
closing DELETE to the worker holding the session.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from tests.browser.browser import chromium
from tests.polling import until
from tests.scaleout.harness import Cluster, cluster
from worldserve.clients.sdk import WorldClient
from worldserve.server.keys import SERVICE

STATE = "() => ({...window.worldserve, pending: window.worldserve.pending.size})"


async def streaming(page: Any, more: int = 5, timeout: float = 60000) -> dict[str, Any]:
    """Wait until ``more`` further frames are shown; the page's state then."""
    shown = (await page.evaluate(STATE))["framesShown"]
    await page.wait_for_function(f"window.worldserve.framesShown > {shown + more}", timeout=timeout)
    state: dict[str, Any] = await page.evaluate(STATE)
    return state


async def placed(c: Cluster, page: Any) -> tuple[str, int]:
    """The session the page streams and the index of the worker holding it."""
    await page.wait_for_function("window.worldserve.framesShown > 3", timeout=60000)
    state = await page.evaluate(STATE)
    assert state["mode"] == "router"
    sid = state["session"]["id"]
    held = await c.holder(sid)
    assert state["server"] == c.worker_url(held)
    assert c.workers[held][SERVICE].live(sid) is not None
    return sid, held


@pytest.mark.parametrize("transport", ["auto", "ws"])
async def test_a_page_from_the_router_follows_a_drain_to_the_other_worker(transport: str) -> None:
    async with cluster(2) as c, chromium() as ctx:
        page = await ctx.new_page()
        errors: list[Any] = []
        page.on("pageerror", lambda e: errors.append(e))
        await page.goto(f"{c.router_url}/?transport={transport}&fps=12")
        sid, held = await placed(c, page)
        other = 1 - held
        state = await page.evaluate(STATE)
        assert state["transport"] == ("webrtc" if transport == "auto" else "ws")

        await c.drain(held)
        await page.wait_for_function("window.worldserve.reconnects > 0", timeout=30000)
        state = await streaming(page)
        assert state["session"]["id"] == sid and state["ended"] is None
        assert state["server"] == c.worker_url(other)
        assert state["transport"] == ("webrtc" if transport == "auto" else "ws")
        assert c.workers[other][SERVICE].live(sid) is not None
        assert len(c.workers[held][SERVICE].store) == 0

        # The worker's DELETE answers the router's page (CORS, preflight included).
        status = await page.evaluate(
            "async (base) => (await fetch(`${base}/v1/sessions/nope`, "
            "{method: 'DELETE', headers: {'X-Session-Token': 'x'}})).status",
            c.worker_url(other))
        assert status == 404
        # Leaving the page: the DELETE goes to the worker holding the session.
        async with page.expect_request(lambda r: r.method == "DELETE", timeout=15000) as req:
            await page.evaluate("window.dispatchEvent(new PageTransitionEvent('pagehide'))")
        assert (await req.value).url == f"{c.worker_url(other)}/v1/sessions/{sid}"
        await until(lambda: len(c.workers[other][SERVICE].store) == 0)
        assert not errors


async def test_a_migrate_with_no_target_resumes_where_the_router_says() -> None:
    """Both workers full: the drain's ``migrate`` has ``url: ""``; once a slot frees, the
    page's ``POST /v1/resume`` re-places the session there from its handoff."""
    async with cluster(2, capacity=1) as c, chromium() as ctx:
        page = await ctx.new_page()
        migrates: list[dict[str, Any]] = []

        def on_socket(ws: Any) -> None:
            def on_frame(payload: Any) -> None:
                if isinstance(payload, bytes):
                    msg = msgpack.unpackb(payload, raw=False)
                    if msg.get("type") == "migrate":
                        migrates.append(msg)
            ws.on("framereceived", on_frame)

        page.on("websocket", on_socket)
        await page.goto(f"{c.router_url}/?transport=ws&fps=12")
        sid, held = await placed(c, page)
        other = 1 - held
        async with WorldClient(router=c.router_url) as sdk:
            await sdk.start("x", fps=4)
            assert sdk.session_id is not None and await c.holder(sdk.session_id) == other
            await c.drain(held)
            await page.wait_for_function(
                "window.worldserve.reconnects > 0 && window.worldserve.migrate === null",
                timeout=30000)
            assert [(m["session_id"], m["url"]) for m in migrates] == [(sid, "")]
        # The SDK's session ended: the other worker has room again.
        await until(lambda: c.workers[other][SERVICE].live(sid) is not None, 60)
        state = await streaming(page)
        assert state["session"]["id"] == sid and state["ended"] is None
        assert state["server"] == c.worker_url(other)
