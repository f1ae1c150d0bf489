"""The worker app as it ships: the core's app (server/app.py) with this worker's agent in the
session directory (Redis with ``directory_url``, else an in-memory one no one else reads).

The core does not name the cluster; the cluster builds on it: ``create_worker`` hands
``create_app`` the ``WorkerAgent`` (server/cluster/agent.py) that registers the worker,
heartbeats, checkpoints, adopts handoffs and drains. With a store (``--store``), the
``Keeper`` (server/cluster/keeper.py) keeps saved worlds on it and, in the embedded mode,
each session's crash checkpoint.
"""

from __future__ import annotations

from aiohttp import web

from worldserve.server.app import create_app
from worldserve.server.cluster.agent import WorkerAgent
from worldserve.server.cluster.directory import Directory, open_directory
from worldserve.server.cluster.keeper import Keeper
from worldserve.server.keys import RunnerFactory
from worldserve.server.metrics import Metrics
from worldserve.server.prompt_filter import PromptChecks
from worldserve.server.saved import WORLDS
from worldserve.server.service import Service
from worldserve.server.settings import Settings
from worldserve.server.store import Store


def create_worker(
    settings: Settings,
    *,
    runner_factory: RunnerFactory | None = None,
    directory: Directory | None = None,
    store: Store | None = None,
    prompt_checks: PromptChecks | None = None,
) -> web.Application:
    """The worker app. ``directory`` overrides the one ``settings.directory_url`` names
    (tests share one ``MemoryDirectory`` between in-process workers), ``store`` the one
    ``settings.store`` names, ``prompt_checks`` those ``settings`` name (loaded beforehand:
    server/prompt_filter.py)."""
    shared = directory is not None or settings.directory_url is not None
    if directory is None:
        directory = open_directory(settings.directory_url, prefix=settings.directory_prefix,
                                   orphan_ttl_s=settings.orphan_ttl_s,
                                   handover_ttl_s=settings.handover_ttl_s)
    joined = directory
    kept: Store | str | None = store if store is not None else settings.store
    if isinstance(kept, str) and kept.strip().lower() in ("", "none", "off"):
        kept = None
    keepers: list[Keeper] = []

    def agent(settings: Settings, service: Service, metrics: Metrics) -> WorkerAgent:
        made = WorkerAgent(settings, service, metrics, joined, shared=shared)
        if kept is not None:  # after the agent: in the embedded mode it is the service's remote
            keepers.append(Keeper(settings, service, metrics, kept, checkpoints=not shared))
        return made

    app = create_app(settings, runner_factory=runner_factory, agent=agent, prompt_checks=prompt_checks)
    for keeper in keepers:
        app[WORLDS] = keeper
        app.cleanup_ctx.append(keeper.ctx)
    return app
