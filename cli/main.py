"""The ``worldserve`` command: ``serve`` runs a worker, ``router`` places sessions on workers,
``soak`` and ``drill`` test a deployment, ``train`` trains the model, ``replay`` regenerates a
served session from its log, ``convert`` turns an authors' Wan file into what the server loads.

``serve`` handles signals itself: SIGINT ends every session and exits (as before); SIGTERM
drains (hands every session to another worker when there is a shared directory, else ends
them) and exits once drained, as ``POST /admin/drain`` does.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# What `pip install "worldserve[server]"` adds: without them only the client is installed.
SERVER_EXTRA = frozenset({"torch", "safetensors", "aiortc", "aioice", "av", "uvloop",
                          "prometheus_client", "redis"})

# Subcommands whose options belong to another module: everything after the name is theirs.
# By name: they load only when they run, and mypy checks the command line, not them.
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
    # here, not at the top: a missing server extra is caught by ``main`` and explained
    from worldserve.cli.convert import convert, convert_parser
    from worldserve.cli.router import route, router_parser
    from worldserve.cli.serve import serve, serve_parser, settings_from

    ap = argparse.ArgumentParser(prog="worldserve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    serve_parser(sub.add_parser("serve", help="run a worker (the session server)"))
    router_parser(sub.add_parser("router", help="place sessions on workers (signaling only)"))
    convert_parser(sub.add_parser("convert", help="an authors' Wan file -> what the server loads "
                                                  "(model/wan/convert.py)"))
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
        convert(args)


