"""``python -m bench.crash_drill``: kill -9 the embedded server under load; every client resumes.

Starts ``worldserve serve`` (the embedded single worker, the default model) on a loopback port with
a store in a temporary directory and crash checkpoints every ``--interval`` seconds, opens
``--sessions`` push sessions (raw frames, each its own seed and a held action), lets them stream
``--stream`` seconds, kills the server with SIGKILL, starts it again on the same store and resumes
every session with its token at the first block its client had not received. For each it records
the reply: resumed or refused, the restored block and the gap (``resumed.gap_blocks`` times the
block's frames: frames shown before the crash that the restored state had not reached), and that
frames come again after it. The goal: every session resumes, each gap at most the frames of one
checkpoint interval plus the blocks generated ahead (``bound_frames``).

Loopback only; bounded in time (``--timeout``, 300 s). Writes a JSON report beside the last line,
``crash_drill sessions=<n> resumed=<n> max_gap_frames=<n> lost=<n> bound_frames=<n>``; exits 1 if a
session was lost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from worldserve.clients.local import Proc, free_port, serve_argv, wait_ready
from worldserve.protocol import Action, Error, Frame, Resume, Resumed, Start, Started, decode_server


@dataclass
class Client:
    seed: int
    started: Started | None = None
    next_block: int = 0  # the first block not wholly received
    frames: int = 0
    resumed: Resumed | None = None
    refused: str = ""
    after: int = 0  # frames received after the resume
    blocks: list[int] = field(default_factory=list)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.crash_drill", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--fps", type=float, default=8.0)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between checkpoints")
    ap.add_argument("--stream", type=float, default=5.0, help="seconds of streaming before the kill")
    ap.add_argument("--timeout", type=float, default=300.0, help="the whole drill, seconds")
    ap.add_argument("--weights", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="the JSON report (default: in the work directory)")
    return ap.parse_args(argv)


def _argv(port: int, store: Path, args: argparse.Namespace) -> list[str]:
    argv = serve_argv("--port", str(port), "--store", str(store),
                      "--snapshot-interval-s", str(args.interval), "--threads", "1", "--buckets", "64",
                      "--warmup-batch-sizes", "1,2,4", "--capacity", str(max(4, args.sessions)),
                      "--admission-threshold", "100", "--min-fps", str(args.fps), "--detached-ttl-s", "120",
                      "--log-level", "INFO")
    return argv + (["--weights", str(args.weights)] if args.weights else [])


async def _stream(http: aiohttp.ClientSession, url: str, c: Client, fps: float, stop: asyncio.Event) -> None:
    async with http.ws_connect(url, max_msg_size=1 << 26) as ws:
        await ws.send_bytes(Start("a green forest", seed=c.seed, fps=fps, bucket=64, codec="raw").encode())
        keys = (("forward",), ("left",), ("right",), ("forward", "right"))[c.seed % 4]
        while not stop.is_set():
            try:
                raw = await ws.receive(timeout=0.5)
            except TimeoutError:
                continue
            if raw.type is not aiohttp.WSMsgType.BINARY:
                return  # the server is gone
            msg = decode_server(raw.data)
            if isinstance(msg, Started):
                c.started = msg
                await ws.send_bytes(Action(1, keys).encode())
            elif isinstance(msg, Frame) and c.started is not None:
                c.frames += 1
                if msg.frame + 1 == _block_start(c.started, msg.block_idx + 1):  # the block's last frame
                    c.next_block = msg.block_idx + 1


def _block_start(st: Started, block_idx: int) -> int:
    if block_idx <= 0:
        return 0
    first = st.chunk_frames if st.first_chunk_frames is None else st.first_chunk_frames
    return first + (block_idx - 1) * st.chunk_frames


async def _resume(http: aiohttp.ClientSession, url: str, c: Client) -> None:
    assert c.started is not None
    async with http.ws_connect(url, max_msg_size=1 << 26) as ws:
        await ws.send_bytes(Resume(c.started.session_id, c.started.token, c.next_block).encode())
        end = time.monotonic() + 30.0
        while time.monotonic() < end and c.after < 2 * c.started.chunk_frames:
            raw = await ws.receive(timeout=max(0.1, end - time.monotonic()))
            if raw.type is not aiohttp.WSMsgType.BINARY:
                break
            msg = decode_server(raw.data)
            if isinstance(msg, Resumed):
                c.resumed = msg
            elif isinstance(msg, Error):
                c.refused = f"{msg.code}: {msg.message}"
                break
            elif isinstance(msg, Frame):
                c.after += 1
                c.blocks.append(msg.block_idx)


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    store, logs = work / "store", work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url, env = f"ws://127.0.0.1:{port}/v1/ws", {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    clients = [Client(seed) for seed in range(args.sessions)]
    first = Proc.spawn("server-1", _argv(port, store, args), logs, env)
    try:
        await wait_ready([f"http://127.0.0.1:{port}/readyz"], [first], 240.0)
        stop = asyncio.Event()
        async with aiohttp.ClientSession() as http:
            tasks = [asyncio.create_task(_stream(http, url, c, args.fps, stop)) for c in clients]
            await asyncio.sleep(args.stream)
            t_kill = time.monotonic()
            first.kill()  # SIGKILL: no shutdown, no last checkpoint
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        first.kill()
        first.close_log()
    second = Proc.spawn("server-2", _argv(port, store, args), logs, env)
    try:
        await wait_ready([f"http://127.0.0.1:{port}/readyz"], [second], 240.0)
        restart_s = time.monotonic() - t_kill
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(_resume(http, url, c) for c in clients if c.started is not None))
    finally:
        second.stop()
    rows = []
    for c in clients:
        chunk = c.started.chunk_frames if c.started else 0
        r = c.resumed
        rows.append({"seed": c.seed, "session_id": c.started.session_id if c.started else None,
                     "frames_before": c.frames, "next_block": c.next_block, "resumed": r is not None,
                     "restored_from": r.restored_from if r else None, "gap_blocks": r.gap_blocks if r else None,
                     "gap_frames": r.gap_blocks * chunk if r else None, "frames_after": c.after,
                     "refused": c.refused})
    resumed = [row for row in rows if row["resumed"] and row["frames_after"] > 0]
    chunk = clients[0].started.chunk_frames if clients[0].started else 1
    return {
        "sessions": len(clients), "resumed": len(resumed), "lost": len(clients) - len(resumed),
        "max_gap_frames": max((row["gap_frames"] for row in resumed), default=0),
        # one interval's frames, plus the blocks generated ahead of the client (lookahead 1, one in flight)
        "bound_frames": int(args.interval * args.fps) + 2 * chunk,
        "interval_s": args.interval, "fps": args.fps, "restart_s": round(restart_s, 2), "rows": rows,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="crash-drill-") as tmp:
        work = Path(tmp)
        report = asyncio.run(asyncio.wait_for(run(args, work), args.timeout))
        out = args.out or Path(tempfile.gettempdir()) / "crash_drill.json"
        out.write_text(json.dumps(report, indent=2))
        print(json.dumps({k: v for k, v in report.items() if k != "rows"}))
        print(f"crash_drill sessions={report['sessions']} resumed={report['resumed']} "
              f"max_gap_frames={report['max_gap_frames']} lost={report['lost']} bound_frames={report['bound_frames']}")
    if report["lost"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
