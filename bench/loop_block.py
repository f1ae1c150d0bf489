"""Event-loop stalls while sessions stream: how late a 5 ms ticker on the server's loop runs.

    python -m bench.loop_block [--sessions 1 8 16 32] [--seconds 5] [--codec jpeg|h264|raw]
                               [--bucket 128] [--frames-per-chunk 1] [--uvloop]
    python -m bench.loop_block --gil

The server (``create_app``, the WebSocket transport, the engine) runs in this process with a
fake model: its model time is a sleep on the model thread, its frames are blocky and move
like a world frame (JPEG and H.264 cost what they cost on real frames, not on flat colour).
The clients run in a child process, so their reading shares neither this loop nor the GIL.
For each level, N push-mode sessions at 24 fps stream ``--codec`` frames; from the moment
every session has its first frame, a task on the server's loop asks to wake every 5 ms for
``--seconds`` and records how late it woke. Anything that holds the loop (encoding a frame
on it, decoding an image, a blocking call) shows up as lateness; the scheduler and the
sockets' own work are there too, and set the floor.

Reports per level: frames/s received by all clients together, the ticker's lateness p50,
p99 and max (ms), and the server's mean encode time per frame (ms, from its metrics).
Last line: ``loop_block sessions=<n> codec=<c> max_late_ms=<x> p99_late_ms=<x>`` for the
largest level.

``--gil``: whether each codec call releases the GIL, which decides how much a pool thread
can still hold the loop back. Per call: ms alone; the throughput of two threads over one
(~2: the GIL is free during the call; ~1: held); and how late a thread that sleeps 1 ms at a
time (as an idle event loop does) wakes while one other thread runs the call back to back.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import time
from dataclasses import dataclass
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from worldserve.protocol import Frame, Start, decode_server
from worldserve.server.app import create_app
from worldserve.server.keys import METRICS, SERVICE
from worldserve.server.settings import Settings
from worldserve.session.fake_runner import FakeRunner, LinearCost
from worldserve.session.plan import StepOutput, StepPlan

TICK_S = 0.005


class TexturedRunner(FakeRunner):
    """The fake runner with frames that look like a world frame to a codec: 4x4 blocks of
    random colour, shifted by a pixel or two each frame."""

    def __init__(self, frames_per_chunk: int, per_batch: float, per_session: float) -> None:
        super().__init__(
            frames_per_chunk=frames_per_chunk,
            cost=LinearCost({64: (per_batch, per_session), 128: (per_batch, per_session)}),
            sleep=time.sleep,
            frame_side=None,
        )
        rng = np.random.default_rng(0)
        self._base = {
            b: np.kron(rng.integers(0, 256, (b // 4 + 4, b // 4 + 4, 3), dtype=np.uint8), np.ones((4, 4, 1), np.uint8))
            for b in self.buckets
        }

    def execute(self, plan: StepPlan) -> StepOutput:
        out = super().execute(plan)
        for r in out.results:
            n, side = r.frames.shape[0], r.frames.shape[1]
            base = self._base[side]
            start = r.block_idx * n
            r.frames = np.stack([base[(k % 16) : (k % 16) + side, (k % 12) : (k % 12) + side]
                                 for k in range(start, start + n)])
        return out


# --- the clients (child process) ------------------------------------------------------


def _clients(url: str, n: int, start: dict[str, Any], ready: MpEvent, measure: MpEvent, stop: MpEvent,
             out: Any) -> None:
    out.put(asyncio.run(_client_main(url, n, start, ready, measure, stop)))


async def _client_main(url: str, n: int, start: dict[str, Any], ready: MpEvent, measure: MpEvent, stop: MpEvent) -> int:
    first = asyncio.Event()
    got_first = 0
    counted = [0]

    async def one(http: aiohttp.ClientSession) -> None:
        nonlocal got_first
        async with http.ws_connect(url, max_msg_size=0) as ws:
            await ws.send_bytes(Start(**start).encode())
            seen = False
            while not stop.is_set():
                try:
                    msg = await ws.receive(timeout=0.2)
                except TimeoutError:
                    continue
                if msg.type is not aiohttp.WSMsgType.BINARY:
                    raise RuntimeError(f"connection closed: {msg.type} {msg.data!r}")
                m = decode_server(msg.data)
                if isinstance(m, Frame):
                    if not seen:
                        seen = True
                        got_first += 1
                        if got_first == n:
                            first.set()
                    if measure.is_set():
                        counted[0] += 1
                elif m.TYPE in ("error", "ended"):
                    raise RuntimeError(f"session failed: {m!r}")

    async with aiohttp.ClientSession() as http:
        tasks = [asyncio.create_task(one(http)) for _ in range(n)]
        await first.wait()
        ready.set()
        await asyncio.gather(*tasks)
    return counted[0]


# --- the server (this process) --------------------------------------------------------


@dataclass
class Level:
    sessions: int
    fps: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    encode_ms: float


async def _ticker(lates: list[float]) -> None:
    loop = asyncio.get_running_loop()
    due = loop.time() + TICK_S
    while True:
        await asyncio.sleep(max(0.0, due - loop.time()))
        now = loop.time()
        lates.append(now - due)
        due = now + TICK_S


def _encode_ms(app: web.Application, codec: str) -> float:
    hist = app[METRICS].encode_latency.labels(codec)
    total = count = 0.0
    for metric in hist.collect():
        for s in metric.samples:
            if s.name.endswith("_sum"):
                total = s.value
            elif s.name.endswith("_count"):
                count = s.value
    return 1000 * total / count if count else float("nan")


async def run_level(args: argparse.Namespace, sessions: int) -> Level:
    settings = Settings(
        port=0, capacity=sessions,
        warmup_batch_sizes=tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= max(sessions, 1)),
        admission_threshold=1e9, buckets=(args.bucket,), log_level="WARNING",
    )
    fpc = args.frames_per_chunk
    app = create_app(settings, runner_factory=lambda s: TexturedRunner(fpc, 0.002, 0.0002))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    while not app[SERVICE].ready:
        if app[SERVICE].failure:
            raise RuntimeError(app[SERVICE].failure)
        await asyncio.sleep(0.02)
    ctx = mp.get_context("spawn")
    ready, measure, stop = ctx.Event(), ctx.Event(), ctx.Event()
    out = ctx.Queue()
    start = {"fps": 24.0, "bucket": args.bucket, "codec": args.codec, "lookahead": 1}
    url = f"http://127.0.0.1:{port}/v1/ws"
    proc = ctx.Process(target=_clients, args=(url, sessions, start, ready, measure, stop, out))
    proc.start()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not ready.is_set():
            if not proc.is_alive() or loop.time() > deadline:
                raise RuntimeError("the clients did not all get a first frame")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # past the start-up
        lates: list[float] = []
        measure.set()
        tick = asyncio.create_task(_ticker(lates))
        t0 = time.perf_counter()
        await asyncio.sleep(args.seconds)
        measure.clear()
        elapsed = time.perf_counter() - t0
        tick.cancel()
        stop.set()
        while out.empty():
            if not proc.is_alive() and out.empty():
                raise RuntimeError("the clients failed")
            await asyncio.sleep(0.05)
        frames = out.get()
        encode_ms = _encode_ms(app, args.codec)
    finally:
        stop.set()
        await runner.cleanup()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
    ms = np.array(lates) * 1000
    return Level(sessions, frames / elapsed, float(np.percentile(ms, 50)), float(np.percentile(ms, 99)),
                 float(ms.max()), encode_ms)


def _gil_work(kind: str) -> Any:
    from worldserve.protocol import Image
    from worldserve.server.encode import make_encoder

    rng = np.random.default_rng(0)
    base = np.kron(rng.integers(0, 256, (132, 132, 3), dtype=np.uint8), np.ones((4, 4, 1), np.uint8))
    frames = [np.ascontiguousarray(base[k % 8 : k % 8 + 128, k % 8 : k % 8 + 128]) for k in range(64)]
    if kind in ("jpeg", "h264"):
        enc, i = make_encoder(kind), [0]  # type: ignore[arg-type]

        def encode() -> None:
            enc.encode(frames[i[0] % 64], i[0])
            i[0] += 1

        return encode
    side = 512 if kind.endswith("512") else 128
    image = Image.from_array(np.ascontiguousarray(base[:side, :side]), "png" if kind.startswith("png") else "jpeg")
    return lambda: image.decode()


def _gil_run(kind: str, threads: int, seconds: float = 1.0) -> tuple[float, np.ndarray]:
    """(calls/s of ``threads`` threads, this thread's 1 ms wake lateness in ms)."""
    import threading

    works = [_gil_work(kind) for _ in range(threads)]
    for w in works:
        w()
    stop, calls = threading.Event(), [0] * threads

    def loop(k: int) -> None:
        while not stop.is_set():
            works[k]()
            calls[k] += 1

    ts = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    lates, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        time.sleep(0.001)
        lates.append(time.perf_counter() - t0 - 0.001)
    stop.set()
    for t in ts:
        t.join()
    return sum(calls) / seconds, np.array(lates) * 1000


def gil_table() -> None:
    _, idle = _gil_run("jpeg", 0)
    print(f"idle: a 1 ms sleep wakes p99 {np.percentile(idle, 99):.3f} ms, max {idle.max():.3f} ms late")
    print(f"{'call (128 px)':>16} {'ms/call':>8} {'2 thr/1 thr':>11} {'wake p99 ms':>11} {'wake max ms':>11}")
    for kind in ("jpeg", "h264", "png-decode", "jpeg-decode", "png-decode-512"):
        work = _gil_work(kind)
        work()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.5:
            work()
            n += 1
        ms = 1000 * (time.perf_counter() - t0) / n
        one, lates = _gil_run(kind, 1)
        two, _ = _gil_run(kind, 2)
        print(f"{kind:>16} {ms:>8.3f} {two / one:>11.2f} {np.percentile(lates, 99):>11.3f} {lates.max():>11.3f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 16, 32])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--codec", choices=["jpeg", "h264", "raw"], default="jpeg")
    p.add_argument("--bucket", type=int, choices=[64, 128], default=128)
    p.add_argument("--frames-per-chunk", type=int, default=1)
    p.add_argument("--uvloop", action="store_true", help="run the server on uvloop (as the CLI does when present)")
    p.add_argument("--gil", action="store_true", help="only the table of codec calls and the GIL")
    args = p.parse_args(argv)
    if args.gil:
        gil_table()
        return
    rows = []
    for n in args.sessions:
        if args.uvloop:
            import uvloop

            lv = uvloop.run(run_level(args, n))
        else:
            lv = asyncio.run(run_level(args, n))
        rows.append(lv)
        print(f"{lv.sessions:>8} {lv.fps:>10.1f} {lv.p50_ms:>9.2f} {lv.p99_ms:>9.2f} "
              f"{lv.max_ms:>9.2f} {lv.encode_ms:>10.3f}", flush=True)
    print(f"\n{'sessions':>8} {'frames/s':>10} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'encode ms':>10}")
    for lv in rows:
        print(f"{lv.sessions:>8} {lv.fps:>10.1f} {lv.p50_ms:>9.2f} {lv.p99_ms:>9.2f} "
              f"{lv.max_ms:>9.2f} {lv.encode_ms:>10.3f}")
    last = rows[-1]
    print(f"loop_block sessions={last.sessions} codec={args.codec} max_late_ms={last.max_ms:.2f} "
          f"p99_late_ms={last.p99_ms:.2f}")


if __name__ == "__main__":
    main()
