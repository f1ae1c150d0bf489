"""``worldserve router``: places sessions on workers (signaling only, server/cluster/router.py)."""

from __future__ import annotations

import argparse
import logging
import os

from worldserve.cli.site import new_loop, run_site
from worldserve.server.cluster.router import RouterSettings, create_router
from worldserve.server.flags import add_flags, build
from worldserve.server.logs import configure


def router_parser(ap: argparse.ArgumentParser) -> None:
    """One flag per ``RouterSettings`` field, as the ``WORLDSERVE_*`` variables."""
    add_flags(ap, RouterSettings)


def route(args: argparse.Namespace) -> None:
    settings = build(RouterSettings, args, os.environ)
    configure(settings.log_format, settings.log_level)
    logging.getLogger("worldserve.cli").info(
        "routing", extra={"host": settings.host, "port": settings.port}
    )
    loop = new_loop()
    try:
        loop.run_until_complete(run_site(create_router(settings), settings.host, settings.port))
    finally:
        loop.close()
