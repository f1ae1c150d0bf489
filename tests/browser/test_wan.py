"""The browser page plays a ``--model wan-causal`` server (a tiny random ``--weights``
directory): WebRTC video, and the WebSocket fallback, both showing its non-square frames."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.browser.browser import chromium
from tests.browser.test_browser import STATE, picture
from tests.model.wan.tiny_dir import HEIGHT, WIDTH, build_tiny_wan_dir
from tests.rtc.harness import serve_rtc
from worldserve.server.app import load_model_runner


@pytest.fixture(scope="module")
def wan_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_wan_dir(tmp_path_factory.mktemp("wan"))


def wan_settings(weights: Path) -> dict[str, Any]:
    return dict(
        model="wan-causal", weights=weights, sizes=((HEIGHT, WIDTH),), dtype="float32", threads=1,
        warmup_batch_sizes=(1, 2), warmup_steps=(4,), admission_threshold=4.0, capacity=4,
        runner_factory=load_model_runner,
    )


@pytest.mark.parametrize("transport", ["webrtc", "ws"])
async def test_the_page_plays_a_wan_causal_server(wan_weights: Path, transport: str) -> None:
    async with serve_rtc(**wan_settings(wan_weights)) as (_app, url), chromium() as ctx:
        if transport == "ws":
            await ctx.add_init_script("delete window.RTCPeerConnection; delete window.webkitRTCPeerConnection;")
        page = await ctx.new_page()
        errors: list[Any] = []
        page.on("pageerror", lambda e: errors.append(e))
        await page.goto(f"{url}/?fps=8&seed=3")
        await page.wait_for_function("window.worldserve.framesShown > 3", timeout=60000)
        state = await page.evaluate(STATE)
        assert state["transport"] == transport
        element = "video" if transport == "webrtc" else "canvas"
        shown = await picture(page, element)
        assert shown.size == HEIGHT * WIDTH * 4 and shown.std() > 0  # its 48x32 frames, not blank
        await page.keyboard.down("d")  # a text-only model ignores keys: the page keeps playing
        await page.wait_for_function(f"window.worldserve.framesShown > {state['framesShown'] + 8}", timeout=60000)
        await page.keyboard.up("d")
        assert await page.inner_text("#stat-size") == f"{WIDTH}×{HEIGHT}"
        assert not errors
