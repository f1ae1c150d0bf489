"""WebRTC and the event loop: aiortc encodes video on its executor thread, and control
messages keep their order while an observation decodes off the loop (the loop guard of
tests/server/loop_guard.py watches every test here)."""

from __future__ import annotations

import numpy as np

from tests.rtc.harness import serve_rtc
from tests.server.loop_guard import LoopGuard
from worldserve.bench._rtc_client import RtcClient
from worldserve.protocol import Ack, Image, Observation, Ping, Pong, Prompt
from worldserve.server.rtc.keys import RTC_PEERS

START = {"prompt": "a green forest", "fps": 24.0, "bucket": 64}


async def test_video_is_encoded_off_the_loop_and_control_keeps_its_order(blockbuster: LoopGuard) -> None:
    # LatencyEncoder.encode is among the guard's codec calls: had aiortc run it on the
    # loop, the guard would have caught it.
    rng = np.random.default_rng(0)
    big = Image.from_array(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8), "png")  # < 256 KB
    async with serve_rtc() as (app, url):
        async with RtcClient(url) as c:
            await c.connect(start=START)
            for _ in range(5):
                await c.next_frame()
            (peer,) = app[RTC_PEERS]
            assert peer.encoder is not None and peer.encoder.frames >= 5
            c.send(Observation(big, id=1))  # decoded off the loop
            c.send(Prompt("a desert", id=2))
            c.send(Ping(3))
            first, _ = await c.message(Ack | Pong)  # type: ignore[arg-type]
            second, _ = await c.message(Ack | Pong)  # type: ignore[arg-type]
            third, _ = await c.message(Ack | Pong)  # type: ignore[arg-type]
            assert [first, second] == [Ack("observation", 1), Ack("prompt", 2)]
            assert isinstance(third, Pong) and third.id == 3
            await c.close()
    assert blockbuster.take() == []
