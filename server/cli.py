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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiohttp import web

    from worldserve.server.settings import Settings

# What `pip install "worldserve[server]"` adds: without them only the client is installed.
SERVER_EXTRA = frozenset({"torch", "safetensors", "aiortc", "aioice", "av", "uvloop",
                          "prometheus_client", "redis"})


def serve_parser(ap: argparse.ArgumentParser) -> None:
    """One flag per ``Settings`` field (server/flags.py): ``--worker-ttl-s`` sets
    ``worker_ttl_s``, as ``WORLDSERVE_WORKER_TTL_S`` does."""
    from worldserve.server.flags import add_flags
    from worldserve.server.settings import Settings

    add_flags(ap, Settings)


def settings_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from the flags, then the ``WORLDSERVE_*`` variables, then the defaults."""
    from worldserve.server.flags import build
    from worldserve.server.settings import Settings

    return build(Settings, args, os.environ if env is None else env)


def router_parser(ap: argparse.ArgumentParser) -> None:
    from worldserve.server.cluster.router import RouterSettings
    from worldserve.server.flags import add_flags

    add_flags(ap, RouterSettings)


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
    from worldserve.server.app import create_app
    from worldserve.server.keys import AGENT
    from worldserve.server.logs import configure

    try:  # the files, before anything heavy loads: a missing one stops the server here
        importlib.import_module("worldserve.model.registry").check(settings.model, settings.weights,
                                                                    settings.recipe)
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
    from worldserve.server.cluster.router import RouterSettings, create_router
    from worldserve.server.flags import build
    from worldserve.server.logs import configure

    settings = build(RouterSettings, args, os.environ)
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
_DELEGATED = {"train": "worldserve.training.train", "soak": "worldserve.clients.soak",
              "drill": "worldserve.bench.drill", "replay": "worldserve.model.replay"}
# ``worldserve train STAGE``: the default world's other training stages (docs/training.md)
_STAGES = {"tokenizer": "worldserve.training.tokenizer", "observer": "worldserve.training.observer"}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv else ""
    try:
        if command == "train" and len(argv) > 1 and argv[1] in _STAGES:
            importlib.import_module(_STAGES[argv[1]]).main(argv[2:])
        elif command in _DELEGATED:
            importlib.import_module(_DELEGATED[command]).main(argv[1:])
        else:
            _run(argv)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SERVER_EXTRA:
            raise
        raise SystemExit(
            f"worldserve {command}: this needs the server extra, which is not installed (no module "
            f"{exc.name!r}): pip install \"worldserve[server]\" (the base install is the client only)"
        ) from None
    except ValueError as exc:  # a setting the settings refuse (flags and variables)
        if command not in ("serve", "router"):
            raise
        raise SystemExit(f"worldserve {command}: {exc}") from None


def _run(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="worldserve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    serve_parser(sub.add_parser("serve", help="run a worker (the session server)"))
    router_parser(sub.add_parser("router", help="place sessions on workers (signaling only)"))
    conv = sub.add_parser("convert", help="an authors' Wan file -> what the server loads "
                                          "(model/wan/convert.py)")
    conv.add_argument("src", type=Path, help="a distilled transformer .pt / .safetensors, or the "
                                             "UMT5 models_t5_umt5-xxl-enc-bf16.pth")
    conv.add_argument("dst", type=Path, help="the .safetensors (a transformer) or folder (UMT5)")
    conv.add_argument("--recipe", help="the checkpoint's recipe: its state dict (EMA or not)")
    conv.add_argument("--lora", type=Path, help="a LoRA to merge in (LongLive's lora.pt)")
    sub.add_parser("train", help="train the world model (training.train's options follow; "
                                 "'train tokenizer|observer ...': the ground tokenizer's stages)",
                   add_help=False)
    sub.add_parser("soak", help="N sessions for a while: latency, drops, RSS (clients.soak)",
                   add_help=False)
    sub.add_parser("drill", help="drain a worker under load and check every session "
                                 "(bench.drill)", add_help=False)
    sub.add_parser("replay", help="regenerate a served session from its log, frame for frame "
                                  "(model/replay.py)", add_help=False)
    args = ap.parse_args(argv)
    if args.command == "serve":
        serve(settings_from(args))
    elif args.command == "router":
        route(args)
    elif args.command == "convert":
        try:
            importlib.import_module("worldserve.model.wan.convert").run(
                args.src, args.dst, recipe=args.recipe, lora=args.lora)
        except (OSError, ValueError, KeyError) as exc:
            raise SystemExit(f"worldserve convert: {exc}") from None
        print(f"wrote {args.dst}")


if __name__ == "__main__":
    main()
