"""The ``worldserve`` command: ``serve`` runs a worker, ``router`` places sessions on
workers, ``soak`` and ``drill`` test a deployment, ``train`` trains the model.

``serve`` handles signals itself: SIGINT ends every session and exits (as before); SIGTERM
drains (hands every session to another worker when there is a shared directory, else ends
them) and exits once drained, as ``POST /admin/drain`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from server.settings import DTYPES, Settings

if TYPE_CHECKING:
    from aiohttp import web


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _sizes(text: str) -> tuple[tuple[int, int], ...]:
    try:
        sizes = tuple((int(h), int(w)) for h, w in (s.lower().split("x") for s in text.split(",") if s.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes as HxW[,HxW], got {text!r}") from None
    if not sizes:
        raise argparse.ArgumentTypeError(f"expected sizes as HxW[,HxW], got {text!r}")
    return sizes


def serve_parser(ap: argparse.ArgumentParser) -> None:
    d = Settings()
    ap.add_argument("--host", default=os.environ.get("WORLDSERVE_HOST", d.host))
    ap.add_argument("--port", type=int, default=int(os.environ.get("WORLDSERVE_PORT", d.port)))
    ap.add_argument("--model", default=os.environ.get("WORLDSERVE_MODEL", d.model),
                    help="model family: default (the embedded model) or wan-causal (docs/models.md)")
    ap.add_argument("--weights", type=Path, default=None,
                    help="model weights: default, a .safetensors with its .json (default: the shipped "
                         "ones); wan-causal, a directory (docs/models.md)")
    ap.add_argument("--size", type=_sizes, default=None,
                    help="frame sizes a latent model serves, HxW[,HxW] (wan-causal: 480x832)")
    ap.add_argument("--threads", type=int, default=d.threads, help="torch threads of the model")
    ap.add_argument("--dtype", choices=DTYPES, default=d.dtype,
                    help="the model's float type; auto (default): bf16 where the CPU has bf16 matrix instructions")
    ap.add_argument("--device", default=d.device, help="cpu (default), cuda or cuda:N")
    ap.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=d.cuda_graphs,
                    help="on a GPU, replay chunks as CUDA graphs (default: on)")
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
    g = ap.add_argument_group("scale-out (docs/operations.md)")
    g.add_argument("--directory", default=os.environ.get("WORLDSERVE_DIRECTORY"),
                   help="shared session directory, e.g. redis://127.0.0.1:6379/0 (default: "
                        "none, the embedded single worker; also WORLDSERVE_DIRECTORY)")
    g.add_argument("--directory-prefix", default=d.directory_prefix,
                   help="key prefix in the directory: one per deployment")
    g.add_argument("--advertise", default=None,
                   help="http base URL clients reach this worker at (default http://HOST:PORT)")
    g.add_argument("--worker-id", default=None, help="default: from the advertised address")
    g.add_argument("--admin-key", default=os.environ.get("WORLDSERVE_ADMIN_KEY"),
                   help="bearer key of POST /admin/drain (also WORLDSERVE_ADMIN_KEY); "
                        "default: the admin API is off")
    g.add_argument("--heartbeat", type=float, default=d.worker_heartbeat_s,
                   help="seconds between directory heartbeats")
    g.add_argument("--worker-ttl", type=float, default=d.worker_ttl_s,
                   help="seconds without a heartbeat before this worker counts as dead")
    g.add_argument("--snapshot-interval", type=float, default=d.snapshot_interval_s,
                   help="seconds between crash-recovery checkpoints of each session (0: off)")
    g.add_argument("--orphan-ttl", type=float, default=d.orphan_ttl_s,
                   help="seconds the directory keeps the record of a session whose worker "
                        f"died (>= the snapshot TTL, {d.snapshot_ttl_s:g} s); set the "
                        "routers' --orphan-ttl to the same")
    g.add_argument("--handover-ttl", type=float, default=d.handover_ttl_s,
                   help="seconds a session handed over by a drain holds its target's slot "
                        "waiting for its client to resume (<= the snapshot TTL); then it is "
                        "orphaned; set the routers' --handover-ttl to the same")
    g.add_argument("--drain-timeout", type=float, default=d.drain_timeout_s,
                   help="seconds a drain waits before ending the sessions left")
    g.add_argument("--placement-threshold", type=float, default=d.placement_threshold,
                   help="a drain moves sessions only to workers below this utilisation")


def settings_from(args: argparse.Namespace) -> Settings:
    keys = set(args.api_key)
    keys.update(k for k in os.environ.get("WORLDSERVE_API_KEYS", "").split(",") if k)
    return Settings(
        host=args.host,
        port=args.port,
        model=args.model,
        weights=args.weights,
        sizes=args.size,
        threads=args.threads,
        dtype=args.dtype,
        device=args.device,
        cuda_graphs=args.cuda_graphs,
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
        directory_url=args.directory,
        directory_prefix=args.directory_prefix,
        advertise=args.advertise,
        worker_id=args.worker_id,
        admin_key=args.admin_key,
        worker_heartbeat_s=args.heartbeat,
        worker_ttl_s=args.worker_ttl,
        snapshot_interval_s=args.snapshot_interval,
        orphan_ttl_s=args.orphan_ttl,
        handover_ttl_s=args.handover_ttl,
        drain_timeout_s=args.drain_timeout,
        placement_threshold=args.placement_threshold,
    )


def router_parser(ap: argparse.ArgumentParser) -> None:
    from server.router import RouterSettings

    d = RouterSettings()
    ap.add_argument("--host", default=d.host)
    ap.add_argument("--port", type=int, default=d.port)
    ap.add_argument("--directory", default=os.environ.get("WORLDSERVE_DIRECTORY", d.directory_url),
                    help="the workers' session directory (redis://...)")
    ap.add_argument("--directory-prefix", default=d.directory_prefix)
    ap.add_argument("--threshold", type=float, default=d.threshold,
                    help="place sessions only on workers below this utilisation")
    ap.add_argument("--api-key", action="append", default=[],
                    help="an API key for /v1/place (repeat; also WORLDSERVE_API_KEYS=a,b)")
    ap.add_argument("--reservation-ttl", type=float, default=d.reservation_ttl_s)
    ap.add_argument("--orphan-ttl", type=float, default=d.orphan_ttl_s,
                    help="seconds the directory keeps the record of a session whose worker "
                         "died; set the workers' --orphan-ttl to the same")
    ap.add_argument("--handover-ttl", type=float, default=d.handover_ttl_s,
                    help="seconds a re-placed session holds its new worker's slot waiting "
                         "for its client; set the workers' --handover-ttl to the same")
    ap.add_argument("--log-format", choices=("kv", "json"), default=d.log_format)
    ap.add_argument("--log-level", default=d.log_level)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


async def _run_site(
    app: web.Application,
    host: str,
    port: int,
    drained: asyncio.Event | None = None,
    drain: Callable[[], object] | None = None,
) -> None:
    """Serve ``app`` until SIGINT (or ``drained`` is set); SIGTERM calls ``drain``."""

    from aiohttp import web

    runner = web.AppRunner(app, access_log=None, shutdown_timeout=10.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGTERM, drain if drain is not None else stop.set)
        waits = [asyncio.ensure_future(stop.wait())]
        if drained is not None:
            waits.append(asyncio.ensure_future(drained.wait()))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
    finally:
        await runner.cleanup()


def serve(settings: Settings) -> None:
    from server.app import create_app
    from server.keys import AGENT
    from server.logs import configure

    try:  # the files, before anything heavy loads: a missing one stops the server here
        importlib.import_module("model.registry").check(settings.model, settings.weights)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"worldserve serve: {exc}") from None
    configure(settings.log_format, settings.log_level)
    loop = _new_loop()
    log = logging.getLogger("worldserve.cli")
    log.info("serving", extra={"host": settings.host, "port": settings.port, "model": settings.model,
                               "loop": type(loop).__module__,
                               "directory": "shared" if settings.directory_url else "embedded"})
    app = create_app(settings)
    agent = app[AGENT]
    try:
        loop.run_until_complete(
            _run_site(app, settings.host, settings.port, agent.drained, agent.begin_drain)
        )
    finally:
        loop.close()


def route(args: argparse.Namespace) -> None:
    from server.logs import configure
    from server.router import RouterSettings, create_router

    keys = set(args.api_key)
    keys.update(k for k in os.environ.get("WORLDSERVE_API_KEYS", "").split(",") if k)
    settings = RouterSettings(
        host=args.host, port=args.port, directory_url=args.directory,
        directory_prefix=args.directory_prefix, threshold=args.threshold,
        api_keys=frozenset(keys), reservation_ttl_s=args.reservation_ttl,
        orphan_ttl_s=args.orphan_ttl, handover_ttl_s=args.handover_ttl,
        log_format=args.log_format, log_level=args.log_level,
    )
    configure(settings.log_format, settings.log_level)
    logging.getLogger("worldserve.cli").info(
        "routing", extra={"host": settings.host, "port": settings.port}
    )
    loop = _new_loop()
    try:
        loop.run_until_complete(_run_site(create_router(settings), settings.host, settings.port))
    finally:
        loop.close()


# Subcommands whose options belong to another module: everything after the name is theirs.
_DELEGATED = {"train": "training.train", "soak": "clients.soak", "drill": "clients.drill"}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="worldserve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    serve_parser(sub.add_parser("serve", help="run a worker (the session server)"))
    router_parser(sub.add_parser("router", help="place sessions on workers (signaling only)"))
    conv = sub.add_parser("convert", help="an authors' Wan .pt checkpoint -> safetensors")
    conv.add_argument("src", type=Path, help="the authors' .pt (generator_ema or generator)")
    conv.add_argument("dst", type=Path, help="the .safetensors to write")
    sub.add_parser("train", help="train the world model (training.train's options follow)",
                   add_help=False)
    sub.add_parser("soak", help="N sessions for a while: latency, drops, RSS (clients.soak)",
                   add_help=False)
    sub.add_parser("drill", help="drain a worker under load and check every session "
                                 "(clients.drill)", add_help=False)
    if argv[:1] and argv[0] in _DELEGATED:
        importlib.import_module(_DELEGATED[argv[0]]).main(argv[1:])
        return
    args = ap.parse_args(argv)
    if args.command == "serve":
        serve(settings_from(args))
    elif args.command == "router":
        route(args)
    elif args.command == "convert":
        try:
            importlib.import_module("model.wan.weights").convert(args.src, args.dst)
        except (OSError, ValueError, KeyError) as exc:
            raise SystemExit(f"worldserve convert: {exc}") from None
        print(f"wrote {args.dst}")


if __name__ == "__main__":
    main()
