"""The browser client in headless Chromium against a server the test starts.

The WebRTC test runs the real model (trained weights, or random-init before they exist);
the others use the fake runner. A key press is checked end to end: the keyboard event
becomes an action on the data channel, the server applies it (the model is conditioned on
it from that frame on: tests/rtc/test_rtc_model.py shows that changes the frames
exactly), and the picture the page shows after it differs from the one before.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from tests.browser.browser import chromium
from tests.polling import until
from tests.rtc.harness import model_settings, serve_rtc
from tests.server.test_e2e_model import smallest_bucket
from worldserve.bench._rtc_client import RtcClient
from worldserve.server.keys import AGENT, SERVICE
from worldserve.server.rtc import RtcSettings
from worldserve.server.rtc.keys import RTC_PEERS

PIXELS = """(id) => {
  const src = document.getElementById(id);
  const w = src.videoWidth || src.width, h = src.videoHeight || src.height;
  const c = document.createElement('canvas');
  c.width = w; c.height = h;
  const g = c.getContext('2d');
  g.drawImage(src, 0, 0);
  return Array.from(g.getImageData(0, 0, w, h).data);
}"""

STATE = "() => ({...window.worldserve, pending: window.worldserve.pending.size})"


async def picture(page: Any, element: str) -> np.ndarray:
    return np.asarray(await page.evaluate(PIXELS, element), np.int16)


async def stats(page: Any) -> dict[str, str]:
    keys = ("fps", "latency", "level", "size", "transport", "session")
    return {k: await page.inner_text(f"#stat-{k}") for k in keys}


async def overlay_counts_frames(page: Any) -> None:
    """The overlay (refreshed every 250 ms) shows the frames of the last second and the
    latencies measured. On a loaded machine the model can take longer than a second for one
    frame and the page's timers run late, so the test waits for a count above zero and a
    latency shown instead of reading them once."""
    await page.wait_for_function(
        "/^[1-9][0-9]*$/.test(document.getElementById('stat-fps').textContent)", timeout=60000)
    await page.wait_for_function(
        "/^[0-9]+ ms$/.test(document.getElementById('stat-latency').textContent)", timeout=60000)


async def steer(page: Any, app: Any, element: str, by: float) -> tuple[np.ndarray, np.ndarray]:
    """Hold D (right) until the server has applied it, the page measured its latency and the
    picture moved (a mean change above ``by``); returns the pictures before and after."""
    state = await page.evaluate(STATE)
    sid = state["session"]["id"]
    before = await picture(page, element)
    await page.keyboard.down("d")
    live = app[SERVICE].live(sid)
    await until(lambda: live.action_seq >= 1)
    await page.wait_for_function("window.worldserve.latencies.length > 0", timeout=15000)
    after = before

    async def moved() -> bool:
        nonlocal after
        after = await picture(page, element)
        return bool(np.abs(before - after).mean() > by)

    await until(moved, what="the picture moving")
    await page.keyboard.up("d")
    return before, after


async def test_webrtc_video_plays_a_key_steers_it_and_the_stats_are_live(model_weights: Path) -> None:
    bucket = smallest_bucket(model_weights)
    async with serve_rtc(**model_settings(model_weights, bucket)) as (app, url), chromium() as ctx:
        page = await ctx.new_page()
        errors: list[Any] = []
        page.on("pageerror", lambda e: errors.append(e))
        await page.goto(f"{url}/?fps=8&seed=3")  # slow: the model shares 2 cores with others
        await page.wait_for_function("window.worldserve.framesShown > 0", timeout=30000)
        state = await page.evaluate(STATE)
        assert (state["transport"], state["codec"]) == ("webrtc", "H264")
        shown = state["framesShown"]
        decoded = await page.evaluate("document.getElementById('video').getVideoPlaybackQuality().totalVideoFrames")
        await page.wait_for_function(f"window.worldserve.framesShown >= {shown + 4}", timeout=30000)
        state = await page.evaluate(STATE)  # still advancing
        assert await page.evaluate(
            "document.getElementById('video').getVideoPlaybackQuality().totalVideoFrames") > decoded
        before, after = await steer(page, app, "video", 1.0)
        assert np.abs(before - after).mean() > 1.0
        await overlay_counts_frames(page)
        s = await stats(page)
        assert re.fullmatch(r"\d+ ms", s["latency"]), s
        assert s["level"].isdigit() and s["size"] == f"{bucket}×{bucket}"
        assert s["transport"] == "WebRTC H264" and s["session"] == state["session"]["id"]
        assert not errors


async def test_without_webrtc_the_page_falls_back_to_websocket_jpeg() -> None:
    async with serve_rtc() as (app, url), chromium() as ctx:
        await ctx.add_init_script("delete window.RTCPeerConnection; delete window.webkitRTCPeerConnection;")
        page = await ctx.new_page()
        await page.goto(f"{url}/")
        await page.wait_for_function("window.worldserve.framesShown > 5", timeout=20000)
        state = await page.evaluate(STATE)
        assert state["transport"] == "ws" and state["lastBlock"] > 0
        assert state["mode"] == "worker" and state["server"] == url
        assert await page.is_hidden("#video") and await page.is_visible("#canvas")
        before, after = await steer(page, app, "canvas", 0.0)  # fake frames: a colour per frame
        assert np.abs(before - after).mean() > 0
        await overlay_counts_frames(page)
        s = await stats(page)
        assert s["transport"] == "WebSocket JPEG"
        assert re.fullmatch(r"\d+ ms", s["latency"]), s


async def test_a_server_with_webrtc_disabled_gets_the_websocket_path() -> None:
    async with serve_rtc(rtc=RtcSettings(enabled=False)) as (_, url), chromium() as ctx:
        page = await ctx.new_page()
        await page.goto(f"{url}/")
        await page.wait_for_function("window.worldserve.framesShown > 3", timeout=20000)
        state = await page.evaluate(STATE)
        assert state["transport"] == "ws"
        assert "disabled" in state["fallbackReason"]


async def test_a_dropped_connection_reconnects_and_resumes_the_same_session() -> None:
    async with serve_rtc() as (app, url), chromium() as ctx:
        page = await ctx.new_page()
        await page.goto(f"{url}/")
        await page.wait_for_function("window.worldserve.framesShown > 3", timeout=20000)
        sid = (await page.evaluate(STATE))["session"]["id"]
        (peer,) = app[RTC_PEERS]
        await peer.close()  # the server side drops: the session is detached
        await page.wait_for_function("window.worldserve.reconnects > 0", timeout=15000)
        shown = (await page.evaluate(STATE))["framesShown"]
        await page.wait_for_function(f"window.worldserve.framesShown > {shown + 5}", timeout=20000)
        state = await page.evaluate(STATE)
        assert state["session"]["id"] == sid and state["transport"] == "webrtc"
        assert app[SERVICE].store.active_count == 1 and len(app[SERVICE].store) == 1
        assert await page.is_hidden("#banner")  # a plain resume (gap_blocks 0) says nothing

        # A resume after a crash (as another worker would answer it: restored from its last
        # checkpoint, some blocks off) shows a short notice with the count.
        async def restored(route: Any) -> None:
            response = await route.fetch()
            body = await response.json()
            if body.get("session", {}).get("type") == "resumed":
                body["session"].update(restored_from=2, gap_blocks=3)
            await route.fulfill(response=response, json=body)

        await page.route("**/v1/rtc/offer", restored)
        (peer,) = app[RTC_PEERS]
        await peer.close()
        await page.wait_for_function("window.worldserve.reconnects > 1", timeout=15000)
        await page.wait_for_function(
            "document.getElementById('banner').textContent"
            ".includes('Resumed after a server restart: 3 blocks were lost')", timeout=15000)
        assert await page.is_visible("#banner")
        assert (await page.evaluate(STATE))["session"]["id"] == sid


async def test_at_capacity_the_page_says_so_and_closing_it_frees_the_session() -> None:
    async with serve_rtc(capacity=1) as (app, url), chromium() as ctx:
        async with RtcClient(url) as other:
            await other.connect(start={"prompt": "x", "bucket": 64})
            page = await ctx.new_page()
            await page.goto(f"{url}/")
            await page.wait_for_function(
                "document.getElementById('banner').textContent.includes('capacity')", timeout=15000)
            assert await page.is_visible("#banner")
            await other.close()
        # The page retries after retry_after and gets the freed slot.
        await page.wait_for_function("window.worldserve.framesShown > 0", timeout=30000)
        assert await page.is_hidden("#banner")
        await page.close()  # pagehide: 'close' on the control channel (and a DELETE)
        await until(lambda: not app[RTC_PEERS] and len(app[SERVICE].store) == 0)


async def test_the_pages_msgpack_matches_python() -> None:
    values: list[Any] = [
        None, True, False, 0, 127, 128, 65535, 2**32, 2**53 - 1, -1, -33, -40000, -(2**40),
        0.5, -1.25, "", "é漢字", "x" * 40, "y" * 70000, [1, [2, [3]]], list(range(20)),
        {"type": "action", "v": 1, "seq": 3, "keys": ["forward"], "mouse": [0.5, -0.25]},
    ]
    async with serve_rtc() as (_, url), chromium() as ctx:
        page = await ctx.new_page()
        await page.goto(f"{url}/?transport=ws")
        encoded = await page.evaluate(
            """async (values) => {
                const m = await import('/web/msgpack.js');
                return values.map((v) => Array.from(m.encode(v)));
            }""", values)
        for v, b in zip(values, encoded, strict=True):
            assert msgpack.unpackb(bytes(b), raw=False) == v
        packed = [list(msgpack.packb(v, use_bin_type=True)) for v in values]
        packed.append(list(msgpack.packb(b"\x00\x01\x02", use_bin_type=True)))
        decoded = await page.evaluate(
            """async (packed) => {
                const m = await import('/web/msgpack.js');
                return packed.map((b) => {
                    const v = m.decode(new Uint8Array(b));
                    return v instanceof Uint8Array ? {bin: Array.from(v)} : v;
                });
            }""", packed)
        assert decoded == [*values, {"bin": [0, 1, 2]}]


async def test_the_prompt_box_changes_the_scene_and_is_acked() -> None:
    async with serve_rtc() as (app, url), chromium() as ctx:
        page = await ctx.new_page()
        await page.goto(f"{url}/")
        await page.wait_for_function("window.worldserve.framesShown > 0", timeout=20000)
        sid = (await page.evaluate(STATE))["session"]["id"]
        await page.fill("#prompt", "a snowy forest at night")
        await page.click("#prompt-form button")
        await page.wait_for_function(
            "document.getElementById('banner').textContent.includes('Scene updated')", timeout=10000)
        live = app[SERVICE].live(sid)
        assert live is not None and live.scene == "a snowy forest at night"


async def test_a_migrate_moves_the_page_to_the_other_worker() -> None:
    """Worker A hands the session to worker B: the page follows ``migrate`` to B's origin
    (a cross-origin offer). B has no handoff for it here (no shared directory), so the
    page's resume there is refused and it opens a new session on B."""
    from worldserve.protocol import Migrate

    async with serve_rtc() as (a, url_a), serve_rtc() as (b, url_b), chromium() as ctx:
        page = await ctx.new_page()
        await page.goto(f"{url_a}/")
        await page.wait_for_function("window.worldserve.framesShown > 0", timeout=20000)
        sid = (await page.evaluate(STATE))["session"]["id"]
        ws_b = url_b.replace("http", "ws", 1) + "/v1/ws"
        a[AGENT].migration.migrated(sid, Migrate(sid, ws_b, 1, "b"))
        await until(lambda: len(b[SERVICE].store) == 1, 20)
        shown = (await page.evaluate(STATE))["framesShown"]
        await page.wait_for_function(f"window.worldserve.framesShown > {shown + 5}", timeout=20000)
        state = await page.evaluate(STATE)
        assert state["transport"] == "webrtc" and state["session"]["id"] != sid
        assert len(a[SERVICE].store) == 0 and not a[RTC_PEERS]


async def test_the_api_key_is_typed_into_the_page_and_kept_never_read_from_the_url() -> None:
    async with serve_rtc(api_keys=frozenset({"the-key"})) as (app, url), chromium() as ctx:
        page = await ctx.new_page()
        await page.goto(f"{url}/?transport=ws&api_key=the-key")  # a leftover link: not used
        assert "api_key" not in page.url and "transport=ws" in page.url
        await page.wait_for_selector("#key-form", state="visible", timeout=20000)
        assert "API key" in await page.inner_text("#banner")
        assert len(app[SERVICE].store) == 0
        await page.fill("#api-key", "the-key")
        await page.click("#key-form button")
        await page.wait_for_function("window.worldserve.framesShown > 0", timeout=20000)
        assert await page.is_hidden("#key-form")
        assert await page.evaluate("localStorage.getItem('worldserve.apiKey')") == "the-key"
        again = await ctx.new_page()  # the same browser: the kept key opens a session at once
        await again.goto(f"{url}/?transport=ws")
        await again.wait_for_function("window.worldserve.framesShown > 0", timeout=20000)
        assert await again.is_hidden("#key-form")
