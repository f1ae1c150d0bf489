"""``worldserve serve``: one worker, the session server.

One flag per ``Settings`` field (server/flags.py), as the ``WORLDSERVE_*`` variables. SIGINT
ends every session and exits; SIGTERM drains (hands every session to another worker when
there is a shared directory, else ends them) and exits once drained, as ``POST
/admin/drain`` does.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
from collections.abc import Mapping
from dataclasses import replace

from worldserve.cli.site import new_loop, run_site
from worldserve.server.flags import add_flags, build
from worldserve.server.logs import configure
from worldserve.server.settings import Settings


def serve_parser(ap: argparse.ArgumentParser) -> None:
    """One flag per ``Settings`` field: ``--worker-ttl-s`` sets ``worker_ttl_s``, as
    ``WORLDSERVE_WORKER_TTL_S`` does."""
    add_flags(ap, Settings)


def settings_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from the flags, then the ``WORLDSERVE_*`` variables, then the defaults; the
    server keeps worlds and checkpoints in ``auto``'s directory unless told otherwise."""
    env = os.environ if env is None else env
    settings = build(Settings, args, env)
    if not hasattr(args, "store") and "WORLDSERVE_STORE" not in env:
        settings = replace(settings, store="auto")
    return settings


def serve(settings: Settings) -> None:
    # The worker's modules (aiortc, av, prometheus_client ...) load when it runs, not when the
    # command line is parsed: a client-only install still parses it and says what is missing.
    from worldserve.server.cluster.worker import create_worker
    from worldserve.server.keys import AGENT
    from worldserve.server.prompt_filter import PromptChecks

    try:  # the files, before anything heavy loads: a missing one stops the server here
        prompt_checks = PromptChecks.from_settings(settings)  # the blocklist read, the operator's check imported
        # by name: mypy checks the server and the command line, not model/
        registry = importlib.import_module("worldserve.model.registry")
        registry.check(settings.model, settings.weights, settings.recipe)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"worldserve serve: {exc}") from None
    configure(settings.log_format, settings.log_level)
    loop = new_loop()
    log = logging.getLogger("worldserve.cli")
    log.info("serving", extra={"host": settings.host, "port": settings.port, "model": settings.model,
                               "loop": type(loop).__module__,
                               "directory": "shared" if settings.directory_url else "embedded"})
    app = create_worker(settings, prompt_checks=prompt_checks)
    agent = app[AGENT]
    try:
        loop.run_until_complete(
            run_site(app, settings.host, settings.port, agent.drained, agent.begin_drain)
        )
    finally:
        loop.close()
