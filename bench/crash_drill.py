"""``python -m bench.crash_drill``: kill -9 the embedded server under load; every client resumes.

Starts ``worldserve serve`` (the embedded single worker, the default model) on a loopback port with
a store in a temporary directory and crash checkpoints every ``--interval`` seconds, opens
``--sessions`` push sessions (raw frames, each its own seed and a held action), lets them stream
``--stream`` seconds, kills the server with SIGKILL and starts it again on the same store. Each
client is the SDK's ``WorldClient``: it sees its connection drop and resumes by itself (reconnecting
with backoff until the new server answers) with its token at the first block it had not received.
For each it records the reply: resumed or refused, the restored block and the gap
(``resumed.gap_blocks`` times the block's frames: frames shown before the crash that the restored
state had not reached), and that frames come again after it (within 60 s of the restart). The
goal: every session resumes, each gap at most the frames of one checkpoint interval plus the
blocks generated ahead (``bound_frames``).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worldserve.clients.local import Proc, free_port, serve_argv, wait_ready
from worldserve.clients.sdk import FrameEvent, SessionEnded, WorldClient
from worldserve.protocol import Error, Resumed, Started


@dataclass
class Client:
    seed: int
    started: Started | None = None
    next_block: int = 0  # the first block not wholly received when the server was killed
    frames: int = 0
    resumed: Resumed | None = None
    refused: str = ""
    after: int = 0  # frames received after the resume


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


async def _session(url: str, c: Client, fps: float, killed: asyncio.Event, deadline: float) -> None:
    """One SDK client: start, hold an action, stream; when the server dies the SDK resumes by
    itself (reconnecting with backoff until the new server answers) and frames come again."""
    keys = (("forward",), ("left",), ("right",), ("forward", "right"))[c.seed % 4]
    async with WorldClient(url, max_retries=12, backoff_s=0.1, decode=False) as client:
        c.started = await client.start("a green forest", seed=c.seed, fps=fps, bucket=64, codec="raw")
        await client.action(keys)
        while time.monotonic() < deadline:
            try:
                ev = await client.recv(timeout=1.0)
            except TimeoutError:
                continue
            except SessionEnded as exc:
                c.refused = str(exc)
                return
            if isinstance(ev, FrameEvent):
                if client.resumed is None:
                    c.frames += 1
                    if not killed.is_set():
                        c.next_block = client._next_block
                elif ev.block_idx >= client.resumed.block_idx:
                    c.after += 1
                    if c.after >= 2 * c.started.chunk_frames:
                        c.resumed = client.resumed
                        return
            elif isinstance(ev, Error) and ev.fatal and client.resumed is not None:
                c.refused = f"{ev.code}: {ev.message}"


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    store, logs = work / "store", work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url, env = f"ws://127.0.0.1:{port}/v1/ws", {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    clients = [Client(seed) for seed in range(args.sessions)]
    first = Proc.spawn("server-1", _argv(port, store, args), logs, env)
    second: Proc | None = None
    try:
        await wait_ready([f"http://127.0.0.1:{port}/readyz"], [first], 240.0)
        killed = asyncio.Event()
        deadline = time.monotonic() + args.timeout
        tasks = [asyncio.create_task(_session(url, c, args.fps, killed, deadline)) for c in clients]
        await asyncio.sleep(args.stream)
        killed.set()
        t_kill = time.monotonic()
        first.kill()  # SIGKILL: no shutdown, no last checkpoint
        second = Proc.spawn("server-2", _argv(port, store, args), logs, env)
        await wait_ready([f"http://127.0.0.1:{port}/readyz"], [second], 240.0)
        restart_s = time.monotonic() - t_kill
        _, late = await asyncio.wait(tasks, timeout=60.0)  # each client resumes by itself, or is lost
        for task in late:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        first.kill()
        first.close_log()
        if second is not None:
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
