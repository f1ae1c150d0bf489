"""WebRTC end to end on loopback with the real model (the trained default weights, or a
random-init model before they exist: ``model_weights`` in tests/server/conftest.py) and an
aiortc client (bench/_rtc_client.py).

Frame indices on the client: the first status that names a frame (``frame`` key) names
the first frame sent, and the received timestamps count on from it at 90 kHz / fps. So
two runs with the same seed can be compared frame by frame, exactly, as
tests/server/test_e2e_model.py does over the WebSocket.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from tests.rtc.harness import model_settings, rss_bytes, serve_rtc
from tests.server.test_e2e_model import smallest_bucket
from worldserve.bench._rtc_client import RtcClient
from worldserve.protocol import Ack, Started, Status
from worldserve.server.keys import SERVICE
from worldserve.server.rtc.keys import RTC_PEERS
from worldserve.server.service import Service

FPS = 4.0  # slow enough that a chunk fits its period even on a loaded 2-core box


def first_frame_index(client: RtcClient) -> int:
    for _, msg, wire in client.messages:
        if isinstance(msg, Status) and wire.get("frame") is not None:  # a status before the first frame names none
            return int(wire["frame"])
    raise AssertionError("no status named a frame")


def by_index(client: RtcClient, frames: list[tuple[float, Any]], idx0: int) -> dict[int, np.ndarray]:
    """Decoded frames by their index in the epoch."""
    step = 90_000 / FPS
    pts0 = frames[0][1].pts
    out = {}
    for _, f in frames:
        k = idx0 + round(((f.pts - pts0) % 2**32) / step)
        out[k] = f.to_ndarray(format="rgb24").astype(np.int16)
    return out


async def run(url: str, bucket: int, frames: int, steer_at: int | None) -> tuple[dict[int, np.ndarray], int | None]:
    """One session (seed 3): ``frames`` decoded frames by index; with ``steer_at``, keys are
    sent over the actions channel after that many frames; returns the first index that
    the status says carries them."""
    got: list[tuple[float, Any]] = []
    applied = None
    async with RtcClient(url) as c:
        await c.connect(start={"prompt": "a green forest", "seed": 3, "fps": FPS,
                               "bucket": bucket, "lookahead": 0})
        seq = None
        while len(got) < frames:
            got.append(await c.next_frame(30))
            if steer_at is not None and len(got) == steer_at:
                seq = c.action(["forward", "right"], (0.5, -0.25))
        idx0 = first_frame_index(c)
        if seq is not None:
            for _, msg, wire in c.messages:
                if isinstance(msg, Status) and wire.get("action_seq") == seq:
                    applied = int(wire["frame"])
                    break
        await c.close()
    return by_index(c, got, idx0), applied


def diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).mean())


async def test_frames_arrive_decode_and_actions_on_the_data_channel_change_them(
    model_weights: Path,
) -> None:
    bucket = smallest_bucket(model_weights)
    # FPS is under min_fps and min_steps is the model's: the ladder has nothing to cut,
    # so both runs make the same frames whatever the load.
    async with serve_rtc(**model_settings(model_weights, bucket, min_steps=4)) as (_, url):
        plain, _ = await run(url, bucket, 18, None)
        steered, applied = await run(url, bucket, 18, 5)
    assert all(f.shape == (bucket, bucket, 3) for f in plain.values())
    assert applied is not None, "the action never showed up in a frame"
    common = sorted(set(plain) & set(steered))
    before = [k for k in common if k < applied]
    after = [k for k in common if k >= applied + 1]
    assert len(before) >= 3 and len(after) >= 5, (before, after)
    same = np.mean([diff(plain[k], steered[k]) for k in before])
    changed = np.mean([diff(plain[k], steered[k]) for k in after])
    # Same seed, same inputs: the same frames (up to the video codec); then the held keys
    # move the picture.
    assert same < 4.0, same
    assert changed > 2.0 + 2 * same, (same, changed)


async def test_a_prompt_on_the_control_channel_is_acked_and_started_comes_first(
    model_weights: Path,
) -> None:
    bucket = smallest_bucket(model_weights)
    async with serve_rtc(**model_settings(model_weights, bucket)) as (_, url):
        async with RtcClient(url) as c:
            answer = await c.connect(start={"prompt": "a green forest", "fps": FPS, "bucket": bucket})
            assert answer["codec"] == "H264"
            assert answer["session"]["type"] == "started"
            started, _ = await c.message(Started)
            assert started.session_id == answer["session"]["session_id"]
            await c.next_frame(30)
            ack = await c.prompt("a snowy forest at night")
            assert ack == Ack("prompt", 1)
            await c.close()


async def test_20_open_close_cycles_leave_server_memory_flat(model_weights: Path) -> None:
    """RSS of this process (server and client share it) after 20 cycles is within 12 MiB
    of its value after 5 warm-up cycles (measured: ~2 MiB); after each cycle every peer
    and session is gone and the server's peer object is garbage."""
    bucket = smallest_bucket(model_weights)
    async with serve_rtc(**model_settings(model_weights, bucket)) as (app, url):
        service: Service = app[SERVICE]

        async def cycle() -> None:
            async with RtcClient(url) as c:
                await c.connect(start={"prompt": "a green forest", "fps": 12.0, "bucket": bucket})
                await c.next_frame(30)
                (peer,) = app[RTC_PEERS]
                gone = weakref.ref(peer)
                del peer
                await c.close()
            end = time.monotonic() + 10
            while (app[RTC_PEERS] or len(service.store)) and time.monotonic() < end:
                await asyncio.sleep(0.02)
            assert not app[RTC_PEERS] and len(service.store) == 0
            gc.collect()
            assert gone() is None, gc.get_referrers(gone())

        for _ in range(5):
            await cycle()
        gc.collect()
        base = rss_bytes()
        samples = []
        for _ in range(20):
            await cycle()
            samples.append(rss_bytes())
        gc.collect()
        grown = rss_bytes() - base
    mib = 1 << 20
    assert grown < 12 * mib, f"RSS grew {grown / mib:.1f} MiB over 20 cycles: {[s // mib for s in samples]}"
