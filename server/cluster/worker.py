"""The worker app as it ships: the core's app (server/app.py) with this worker's agent in the
session directory (Redis with ``directory_url``, else an in-memory one no one else reads).

The core does not name the cluster; the cluster builds on it: ``create_worker`` hands
``create_app`` the ``WorkerAgent`` (server/cluster/agent.py) that registers the worker,
heartbeats, checkpoints, adopts handoffs and drains.
"""

from __future__ import annotations

from aiohttp import web

from worldserve.server.app import create_app
from worldserve.server.cluster.agent import WorkerAgent
from worldserve.server.cluster.directory import Directory, open_directory
from worldserve.server.keys import RunnerFactory
from worldserve.server.metrics import Metrics
from worldserve.server.service import Service
from worldserve.server.settings import Settings


def create_worker(
    settings: Settings,
    *,
    runner_factory: RunnerFactory | None = None,
    directory: Directory | None = None,
) -> web.Application:
    """The worker app. ``directory`` overrides the one ``settings.directory_url`` names
    (tests share one ``MemoryDirectory`` between in-process workers)."""
    shared = directory is not None or settings.directory_url is not None
    if directory is None:
        directory = open_directory(settings.directory_url, prefix=settings.directory_prefix,
                                   orphan_ttl_s=settings.orphan_ttl_s,
                                   handover_ttl_s=settings.handover_ttl_s)
    joined = directory

    def agent(settings: Settings, service: Service, metrics: Metrics) -> WorkerAgent:
        return WorkerAgent(settings, service, metrics, joined, shared=shared)

    return create_app(settings, runner_factory=runner_factory, agent=agent)
