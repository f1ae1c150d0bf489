"""The ``worldserve`` command: ``serve`` runs the server, ``train`` trains the model."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from pathlib import Path

from server.settings import Settings


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def serve_parser(ap: argparse.ArgumentParser) -> None:
    d = Settings()
    ap.add_argument("--host", default=os.environ.get("WORLDSERVE_HOST", d.host))
    ap.add_argument("--port", type=int, default=int(os.environ.get("WORLDSERVE_PORT", d.port)))
    ap.add_argument("--weights", type=Path, default=None,
                    help="model weights (.safetensors with its .json); default: the shipped ones")
    ap.add_argument("--threads", type=int, default=d.threads, help="torch threads of the model")
    ap.add_argument("--capacity", type=int, default=d.capacity, help="sessions held at once")
    ap.add_argument("--detached-ttl", type=float, default=d.detached_ttl_s,
                    help="seconds a dropped session stays resumable")
    ap.add_argument("--buckets", type=_ints, default=None, help="served buckets, e.g. 64,128")
    ap.add_argument("--batch-sizes", type=_ints, default=d.warmup_batch_sizes,
                    help="batch sizes to warm up and batch at, e.g. 1,2,4,8")
    ap.add_argument("--warmup-steps", type=_ints, default=None,
                    help="denoising step counts to warm (default: the ladder's)")
    ap.add_argument("--no-batching", action="store_true", help="step every session alone")
    ap.add_argument("--batch-window", type=float, default=d.batch_window_s, help="seconds")
    ap.add_argument("--release-ahead", type=float, default=d.release_ahead, help="chunk periods")
    ap.add_argument("--min-steps", type=int, default=d.min_steps)
    ap.add_argument("--min-fps", type=float, default=d.min_fps)
    ap.add_argument("--pull-deadline", type=float, default=d.pull_deadline_s, help="seconds")
    ap.add_argument("--admission-threshold", type=float, default=d.admission_threshold)
    ap.add_argument("--api-key", action="append", default=[],
                    help="an API key for session creation (repeat; also WORLDSERVE_API_KEYS=a,b)")
    ap.add_argument("--max-msg-size", type=int, default=d.max_msg_size, help="bytes")
    ap.add_argument("--jpeg-quality", type=int, default=d.jpeg_quality)
    ap.add_argument("--log-format", choices=("kv", "json"), default=d.log_format)
    ap.add_argument("--log-level", default=d.log_level)


def settings_from(args: argparse.Namespace) -> Settings:
    keys = set(args.api_key)
    keys.update(k for k in os.environ.get("WORLDSERVE_API_KEYS", "").split(",") if k)
    return Settings(
        host=args.host,
        port=args.port,
        weights=args.weights,
        threads=args.threads,
        capacity=args.capacity,
        detached_ttl_s=args.detached_ttl,
        buckets=args.buckets,
        warmup_batch_sizes=args.batch_sizes,
        warmup_steps=args.warmup_steps,
        batching=not args.no_batching,
        batch_window_s=args.batch_window,
        release_ahead=args.release_ahead,
        min_steps=args.min_steps,
        min_fps=args.min_fps,
        pull_deadline_s=args.pull_deadline,
        admission_threshold=args.admission_threshold,
        api_keys=frozenset(keys),
        max_msg_size=args.max_msg_size,
        jpeg_quality=args.jpeg_quality,
        log_format=args.log_format,
        log_level=args.log_level,
    )


def serve(settings: Settings) -> None:
    from aiohttp import web

    from server.app import create_app
    from server.logs import configure

    configure(settings.log_format, settings.log_level)
    loop: asyncio.AbstractEventLoop
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    log = logging.getLogger("worldserve.cli")
    log.info("serving", extra={"host": settings.host, "port": settings.port,
                               "loop": type(loop).__module__})
    web.run_app(
        create_app(settings), host=settings.host, port=settings.port, loop=loop,
        print=None, access_log=None, shutdown_timeout=10.0,
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="worldserve", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    serve_parser(sub.add_parser("serve", help="run the session server"))
    sub.add_parser("train", help="train the world model (model.train's options follow)",
                   add_help=False)
    if argv[:1] == ["train"]:
        importlib.import_module("model.train").main(argv[1:])
        return
    args = ap.parse_args(argv)
    if args.command == "serve":
        serve(settings_from(args))


if __name__ == "__main__":
    main()
