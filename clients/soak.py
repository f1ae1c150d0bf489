"""``worldserve soak``: N WebSocket sessions for a while, with scripted actions.

    worldserve soak --url ws://127.0.0.1:8000/v1/ws --sessions 4 --duration 60
    worldserve soak --router http://127.0.0.1:8080 --sessions 8 --duration 600

Each session is a ``Probe`` (clients/probe.py): a new action every ``--action-period``
seconds, every frame's arrival recorded. The server's RSS is scraped from ``/metrics``
(``process_resident_memory_bytes``) every ``--scrape`` seconds: the worker behind
``--url``, or every worker the router lists. Reported (JSON, and a PNG drawn with Pillow):

- frame interval p50/p99 (arrival to arrival, per session) and action-to-frame latency
  p50/p99 (an action sent → the first frame whose ``action_seq`` includes it);
- skipped frames (``skipped``: the server could not generate in time), deadline misses
  and slow-reader drops (``status``), blocks missing from what arrived, errors;
- RSS over time per worker; ``rss_growth`` is (last - first) / first of the worst worker,
  from the first sample after every session started.

Last line: ``soak sessions=<n> errors=<n> rss_growth=<x> p99_interval_ms=<x>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from worldserve.clients.plot import Panel, Series, draw
from worldserve.clients.probe import Probe, percentile
from worldserve.clients.sdk import SessionEnded, WorldClient

_RSS = re.compile(rb"^process_resident_memory_bytes\s+([0-9.eE+]+)\s*$", re.M)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="worldserve soak", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a worker's WebSocket URL (ws://host:port/v1/ws)")
    where.add_argument("--router", help="a router's http URL (sessions are placed through it)")
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of streaming")
    ap.add_argument("--fps", type=float, default=8.0)
    ap.add_argument("--bucket", type=int, default=64)
    ap.add_argument("--codec", choices=("jpeg", "raw", "h264"), default="jpeg")
    ap.add_argument("--mode", choices=("push", "pull"), default="push")
    ap.add_argument("--prompt", default="a green forest")
    ap.add_argument("--action-period", type=float, default=0.5, help="seconds between actions")
    ap.add_argument("--metrics", action="append", default=[],
                    help="a /metrics URL to scrape for RSS (repeat; default: derived)")
    ap.add_argument("--scrape", type=float, default=1.0, help="seconds between RSS scrapes")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--out", type=Path, default=Path("soak.json"))
    ap.add_argument("--plot", type=Path, default=None, help="PNG (default: the --out name .png)")
    args = ap.parse_args(argv)
    if args.sessions < 1 or args.duration <= 0:
        ap.error("need --sessions >= 1 and --duration > 0")
    return args


def metrics_url(ws_url: str) -> str:
    parts = urlsplit(ws_url)
    scheme = {"wss": "https", "ws": "http"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "/metrics", "", ""))


async def scrape_rss(http: aiohttp.ClientSession, url: str) -> float | None:
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
            m = _RSS.search(await resp.read())
    except (aiohttp.ClientError, TimeoutError):
        return None
    return float(m.group(1)) if m else None


async def metrics_urls(http: aiohttp.ClientSession, args: argparse.Namespace) -> list[str]:
    if args.metrics:
        return list(args.metrics)
    if args.url:
        return [metrics_url(args.url)]
    try:
        async with http.get(f"{args.router.rstrip('/')}/v1/workers") as resp:
            workers = (await resp.json())["workers"]
    except (aiohttp.ClientError, TimeoutError, KeyError, ValueError):
        return []
    return [f"{w['address'].rstrip('/')}/metrics" for w in workers]


async def run_soak(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    deadline = t0 + float(args.duration)
    rss: dict[str, list[tuple[float, float]]] = {}
    started: list[float] = []  # when each session started (seconds into the run)
    start_errors: list[str] = []

    def over() -> bool:
        return time.monotonic() >= deadline

    async with aiohttp.ClientSession() as http:

        async def sample() -> None:
            while not over():
                now = time.monotonic() - t0
                for url in await metrics_urls(http, args):
                    value = await scrape_rss(http, url)
                    if value is not None:
                        rss.setdefault(url, []).append((now, value))
                await asyncio.sleep(args.scrape)

        async def one(i: int) -> Probe | None:
            client = WorldClient(args.url, router=args.router, api_key=args.api_key, http=http)
            probe = Probe(client, i, action_period_s=args.action_period, pull=args.mode == "pull")
            try:
                await client.start(args.prompt, seed=i, fps=args.fps, bucket=args.bucket,
                                   codec=args.codec, mode=args.mode)
                started.append(time.monotonic() - t0)
                await probe.run(over, timeout=30.0)
                return probe
            except (SessionEnded, aiohttp.ClientError, TimeoutError, OSError) as exc:
                start_errors.append(f"session {i}: {type(exc).__name__}: {exc}")
                return probe if probe.frames else None
            finally:
                await client.close()

        sampler = asyncio.create_task(sample())
        probes = [p for p in await asyncio.gather(*(one(i) for i in range(args.sessions))) if p]
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
    # RSS growth counts from when the last session started (model warm, buffers allocated).
    return summarize(args, probes, rss, max(started, default=0.0), start_errors, t0)


def summarize(args: argparse.Namespace, probes: list[Probe], rss: dict[str, list[tuple[float, float]]],
              warm: float, start_errors: list[str], t0: float) -> dict[str, Any]:
    intervals = [x for p in probes for x in p.intervals()]
    latency = [x for p in probes for x in p.action_latency]
    missing = sum(p.lost_and_duplicated()[0] for p in probes)
    errors = len(start_errors) + sum(len(p.errors) for p in probes) + sum(
        1 for p in probes if p.ended is not None)
    growth = {}
    for url, samples in rss.items():
        after = [v for t, v in samples if t >= warm] or [v for _, v in samples]
        growth[url] = (after[-1] - after[0]) / after[0] if after and after[0] else 0.0
    return {
        "sessions": args.sessions,
        "duration_s": args.duration,
        "fps": args.fps,
        "mode": args.mode,
        "codec": args.codec,
        "frames": sum(len(p.frames) for p in probes),
        "interval_ms": {"p50": percentile(intervals, 50) * 1e3, "p99": percentile(intervals, 99) * 1e3},
        "action_to_frame_ms": {"p50": percentile(latency, 50) * 1e3, "p99": percentile(latency, 99) * 1e3},
        "skipped_frames": sum(p.skipped_frames for p in probes),
        "deadline_misses": sum(sum(p.status_misses.values()) for p in probes),
        "drops": sum(sum(p.status_drops.values()) for p in probes),
        "blocks_missing": missing,
        "migrations": sum(p.client.migrations for p in probes),
        "errors": errors,
        "error_messages": start_errors + [e for p in probes for e in p.errors][:50],
        "rss_bytes": {url: s for url, s in rss.items()},
        "rss_growth": max(growth.values(), default=0.0),
        "per_session": [
            {"session": p.index, "frames": len(p.frames), "skipped": p.skipped_frames,
             "interval_p99_ms": percentile(p.intervals(), 99) * 1e3, "errors": p.errors,
             "ended": p.ended}
            for p in probes
        ],
        "_series": {  # for the plot; dropped from the JSON
            "intervals": [(f.t - t0, (f.t - prev.t) * 1e3) for p in probes
                          for prev, f in zip(p.frames, p.frames[1:], strict=False)],
        },
    }


def plot(report: dict[str, Any], path: Path) -> None:
    rss_panel = Panel("server RSS", "MiB", [
        Series(urlsplit(url).netloc, [t for t, _ in s], [v / 2**20 for _, v in s])
        for url, s in report["rss_bytes"].items()
    ], zero=False)
    points = sorted(report["_series"]["intervals"])
    buckets: dict[int, list[float]] = {}
    for t, ms in points:
        buckets.setdefault(int(t), []).append(ms)
    xs = sorted(buckets)
    interval_panel = Panel("frame interval, per second of the run", "ms", [
        Series("p50", [float(x) for x in xs], [percentile(buckets[x], 50) for x in xs]),
        Series("p99", [float(x) for x in xs], [percentile(buckets[x], 99) for x in xs]),
    ])
    title = (f"worldserve soak: {report['sessions']} sessions, {report['duration_s']:g} s at "
             f"{report['fps']:g} fps ({report['mode']}, {report['codec']})")
    draw(path, title, [interval_panel, rss_panel])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report = asyncio.run(run_soak(args))
    png = args.plot or args.out.with_suffix(".png")
    plot(report, png)
    report.pop("_series")
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    i, a = report["interval_ms"], report["action_to_frame_ms"]
    print(f"soak: {report['frames']} frames; interval p50 {i['p50']:.1f} ms p99 {i['p99']:.1f} ms; "
          f"action->frame p50 {a['p50']:.1f} ms p99 {a['p99']:.1f} ms; skipped "
          f"{report['skipped_frames']}, misses {report['deadline_misses']}, drops {report['drops']}, "
          f"missing blocks {report['blocks_missing']}; report {args.out}, plot {png}")
    print(f"soak sessions={report['sessions']} errors={report['errors']} "
          f"rss_growth={report['rss_growth']:.4f} p99_interval_ms={i['p99']:.1f}")


if __name__ == "__main__":
    main()
