"""Loopback latency: time to first frame and WebSocket action-to-frame latency.

    python -m bench.latency [--weights PATH] [--actions 40] [--fps 24] [--bucket 64] [--no-cpu-trace]

Starts the real server in this process on a free loopback port (default weights, or
``--weights``), opens one push session with the Python SDK and measures:

- time to first frame: from sending ``start`` to receiving the first frame;
- action to frame: from sending an action to receiving the first frame whose
  ``action_seq`` includes it (actions alternate keys, one every ``--interval`` s).
- the same over WebRTC (bench/_rtc_client.py, an aiortc peer on loopback): the action
  goes on the ``actions`` data channel; it ends at the first decoded video frame that
  arrives after the status saying the frame carrying it was sent.

It first prints encode milliseconds per frame for each codec and bucket (the WebRTC
encoders as ``rtc-h264`` / ``rtc-vp8``). The last line is
``latency ttff_ms=<x> ws_p50_ms=<x> ws_p99_ms=<x> rtc_p50_ms=<x> rtc_p99_ms=<x>``.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
from pathlib import Path

import numpy as np
from aiohttp import web

from worldserve.bench import encode_cost
from worldserve.bench._rtc_client import RtcClient
from worldserve.clients.sdk import FrameEvent, WorldClient
from worldserve.protocol import Status
from worldserve.server.app import create_app
from worldserve.server.keys import SERVICE
from worldserve.server.logs import configure
from worldserve.server.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run(args: argparse.Namespace) -> str:
    settings = Settings(
        port=free_port(),
        weights=args.weights,
        threads=args.threads,
        buckets=(args.bucket,),
        warmup_batch_sizes=(1,),
        capacity=2,
        cpu_trace=args.cpu_trace,
    )
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", settings.port)
    await site.start()
    try:
        t0 = time.perf_counter()
        while not app[SERVICE].ready:
            if app[SERVICE].failure:
                raise SystemExit(f"server failed: {app[SERVICE].failure}")
            await asyncio.sleep(0.05)
        print(f"ready in {time.perf_counter() - t0:.2f} s (model load + warm-up)")
        url = f"ws://127.0.0.1:{settings.port}/v1/ws"
        async with WorldClient(url, decode=False) as client:
            t_start = time.perf_counter()
            started = await client.start(
                "a green forest", fps=args.fps, bucket=args.bucket, lookahead=args.lookahead
            )
            await client.next_frame(30)
            ttff = (time.perf_counter() - t_start) * 1000
            print(f"session level={started.level} fps={started.fps} steps={started.steps} "
                  f"lookahead={started.lookahead}")
            lat = await action_latency(client, args.actions, args.interval)
        rtc = await rtc_action_latency(f"http://127.0.0.1:{settings.port}", args)
    finally:
        await runner.cleanup()
    p50, p99 = (np.percentile(lat, q) if lat else float("nan") for q in (50, 99))
    print(f"actions={len(lat)} min_ms={min(lat, default=float('nan')):.1f} "
          f"max_ms={max(lat, default=float('nan')):.1f}")
    r50, r99 = (np.percentile(rtc, q) if rtc else float("nan") for q in (50, 99))
    print(f"rtc_actions={len(rtc)} min_ms={min(rtc, default=float('nan')):.1f} "
          f"max_ms={max(rtc, default=float('nan')):.1f}")
    return (f"latency ttff_ms={ttff:.1f} ws_p50_ms={p50:.1f} ws_p99_ms={p99:.1f} "
            f"rtc_p50_ms={r50:.1f} rtc_p99_ms={r99:.1f}")


async def action_latency(client: WorldClient, n: int, interval: float) -> list[float]:
    """Send ``n`` actions; for each, ms until the first frame that applied it."""
    sent: dict[int, float] = {}
    out: list[float] = []
    keys = (("forward",), ("right",), ("back",), ("left",))
    done = asyncio.Event()

    async def reader() -> None:
        while len(out) < n:
            ev: FrameEvent = await client.next_frame(30)
            now = time.perf_counter()
            for seq in [s for s in sent if s <= ev.msg.action_seq]:
                out.append((now - sent.pop(seq)) * 1000)
        done.set()

    task = asyncio.create_task(reader())
    for i in range(n):
        seq = await client.action(keys[i % len(keys)])
        sent[seq] = time.perf_counter()
        await asyncio.sleep(interval)
    try:
        await asyncio.wait_for(done.wait(), 30)
    finally:
        task.cancel()
    return out


async def rtc_action_latency(base_url: str, args: argparse.Namespace) -> list[float]:
    """Over WebRTC: ms from an action on the data channel to the first decoded frame that
    arrives after the status naming the frame that carries it."""
    keys = (("forward",), ("right",), ("back",), ("left",))
    out: list[float] = []
    async with RtcClient(base_url) as c:
        await c.connect(start={"prompt": "a green forest", "fps": args.fps, "bucket": args.bucket,
                               "lookahead": args.lookahead})
        await c.next_frame(30)
        for i in range(args.actions):
            t0 = time.monotonic()
            seq = c.action(keys[i % len(keys)])
            try:
                while True:
                    _, wire = await c.message(Status, 5)
                    if wire.get("action_seq", 0) >= seq:
                        break
                c.frames.clear()
                t_frame, _ = await c.next_frame(5)
                out.append((t_frame - t0) * 1000)
            except TimeoutError:
                pass
            await asyncio.sleep(max(0.0, args.interval - (time.monotonic() - t0)))
        await c.close()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="loopback time to first frame and action latency")
    ap.add_argument("--weights", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fps", type=float, default=24.0)
    ap.add_argument("--bucket", type=int, default=64)
    ap.add_argument("--lookahead", type=int, default=0)
    ap.add_argument("--cpu-trace", action=argparse.BooleanOptionalAction, default=True,
                    help="chunks as TorchScript traces (the server's default)")
    ap.add_argument("--actions", type=int, default=40)
    ap.add_argument("--interval", type=float, default=0.15, help="seconds between actions")
    ap.add_argument("--encode-buckets", type=lambda t: tuple(int(x) for x in t.split(",")),
                    default=(64, 128, 256))
    args = ap.parse_args(argv)
    configure("kv", "WARNING")
    for line in encode_cost.table(args.encode_buckets):
        print(line)
    try:
        import uvloop

        line = uvloop.run(run(args))
    except ImportError:
        line = asyncio.run(run(args))
    print(line)


if __name__ == "__main__":
    main()
