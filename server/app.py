"""The aiohttp application factory.

``create_app(settings)`` wires the state (typed keys in server/keys.py), the routes
(``/v1/ws`` for the WebSocket protocol, the HTTP API in server/http_api.py) and the
lifecycle:

- ``cleanup_ctx``: the codec pool (server/offload.py), where frames are encoded and
  observations decoded, off the event loop; opened first, shut down last.
- ``cleanup_ctx``: load the model and warm it up on the model executor thread, in the
  background, so ``/healthz`` answers at once and ``/readyz`` says 503 until the engine
  runs; on exit stop the service, the engine and the model thread.
- ``on_shutdown``: end every session (clients get ``ended: shutdown``) and close every
  registered connection (``CLOSABLES``: WebSockets and WebRTC peers).
- ``cleanup_ctx``: the cluster's agent, given as ``agent`` (server/cluster/worker.py gives the
  ``WorkerAgent``), registers the worker in the session directory, heartbeats, checkpoints
  and drains; it leaves the directory on exit. The core names nothing of server/cluster/:
  it declares what it calls (``Agent`` in server/keys.py, ``Remote`` in server/remote.py).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path

from aiohttp import web

from worldserve.protocol import CloseCode
from worldserve.server import trace_dir
from worldserve.server.engine import model_executor
from worldserve.server.http_api import add_routes
from worldserve.server.keys import (
    AGENT,
    CLOSABLES,
    CODECS,
    METRICS,
    RUNNER_FACTORY,
    SERVICE,
    SETTINGS,
    AgentFactory,
    Closable,
    RunnerFactory,
)
from worldserve.server.metrics import Metrics
from worldserve.server.offload import CodecPool
from worldserve.server.prompt_filter import PromptChecks
from worldserve.server.rtc import setup_rtc
from worldserve.server.saved import add_world_routes
from worldserve.server.service import Service
from worldserve.server.settings import Settings
from worldserve.server.ws import websocket_handler
from worldserve.session.plan import Runner
from worldserve.session.warmup import ladder_steps, warm_up, warmup_shapes

log = logging.getLogger("worldserve.app")


def load_model_runner(settings: Settings) -> Runner:
    """The runner of ``settings.model`` from the model registry (model/registry.py). torch is
    imported only there, and by name: server/ depends on the ``Runner`` protocol, not on
    model/ (which mypy does not check)."""
    registry = importlib.import_module("worldserve.model.registry")
    slots = max(settings.capacity, max(settings.warmup_batch_sizes)) + 1
    options = registry.LoadOptions(
        weights=settings.weights, threads=settings.threads, dtype=settings.dtype, device=settings.device,
        max_sessions=slots, cuda_graphs=settings.cuda_graphs, cpu_trace=settings.cpu_trace,
        trace_cache=settings.trace_cache, trace_cache_dir=trace_cache_dir(settings),
        sizes=settings.sizes, recipe=settings.recipe, vae=settings.vae, canvas=settings.canvas,
        canvas_decode=settings.canvas_decode, canvas_trust=settings.canvas_trust,
        canvas_sharpen=settings.canvas_sharpen, canvas_live=settings.canvas_live,
    )
    runner: Runner = registry.load(settings.model, options)
    log.info("model %s from %s, %s on %s, %s thread(s)", settings.model, settings.weights or "the shipped weights",
             runner.capabilities.dtype, settings.device, settings.threads or "default")
    return runner


def trace_cache_dir(settings: Settings) -> Path | None:
    """Where the default model's TorchScript traces are kept: checked to be this user's alone
    before anything is loaded from it (server/trace_dir.py)."""
    if not (settings.trace_cache and settings.model == "default"):
        return settings.trace_cache_dir
    return trace_dir.checked(settings.trace_cache_dir)


def create_app(
    settings: Settings,
    *,
    runner_factory: RunnerFactory | None = None,
    agent: AgentFactory | None = None,
    prompt_checks: PromptChecks | None = None,
) -> web.Application:
    """The worker app; ``agent`` makes this worker's agent in the cluster (without one there
    is no directory and no drain: ``/admin/drain`` answers 404). ``prompt_checks``: the
    prompt filter's, loaded beforehand (None: loaded here, from ``settings``)."""
    app = web.Application()
    metrics = Metrics()
    app[SETTINGS] = settings
    app[METRICS] = metrics
    codecs = app[CODECS] = CodecPool()
    service = app[SERVICE] = Service(settings, metrics, codecs=codecs, prompt_checks=prompt_checks)
    if agent is not None:
        app[AGENT] = agent(settings, service, metrics)
    app[CLOSABLES] = set[Closable]()
    app[RUNNER_FACTORY] = runner_factory or load_model_runner
    app.router.add_get("/v1/ws", websocket_handler)
    add_routes(app)
    add_world_routes(app)  # saved worlds (server/saved.py): 404 store_error without a store
    setup_rtc(app, settings.rtc)  # WebRTC offers and the browser client (server/rtc/)
    app.cleanup_ctx.append(_codecs_ctx)  # first in, last out: it outlives every connection
    app.cleanup_ctx.append(_model_ctx)
    if agent is not None:
        app.cleanup_ctx.append(_agent_ctx)
    app.on_shutdown.append(_close_connections)
    return app


async def _codecs_ctx(app: web.Application) -> AsyncIterator[None]:
    codecs = app[CODECS]
    codecs.open()
    yield
    await codecs.close()


async def _agent_ctx(app: web.Application) -> AsyncIterator[None]:
    agent = app[AGENT]
    await agent.start()
    yield
    await agent.stop()


async def _model_ctx(app: web.Application) -> AsyncIterator[None]:
    service = app[SERVICE]
    executor = model_executor()
    loading = asyncio.create_task(_load(app, executor), name="worldserve-load")
    yield
    loading.cancel()
    with suppress(asyncio.CancelledError):
        await loading
    await service.stop()
    if service.engine is None:  # never handed to an engine: shut the thread down here
        await asyncio.get_running_loop().run_in_executor(None, executor.shutdown, True)


async def _load(app: web.Application, executor: ThreadPoolExecutor) -> None:
    settings, service = app[SETTINGS], app[SERVICE]
    loop = asyncio.get_running_loop()
    try:
        t0 = time.perf_counter()
        runner = await loop.run_in_executor(executor, app[RUNNER_FACTORY], settings)
        buckets = settings.buckets or tuple(runner.buckets)
        unknown = sorted(set(buckets) - set(runner.buckets))
        if unknown:
            raise ValueError(f"buckets {unknown} are not the model's {list(runner.buckets)}")
        trained = tuple(len(ts) for ts in runner.capabilities.schedules)  # (): any count
        steps = settings.warmup_steps or ladder_steps(runner.max_steps, settings.min_steps, trained)
        steps = tuple(s for s in steps if s <= runner.max_steps and (not trained or s in trained))
        steps = steps or (runner.max_steps,)
        shapes = warmup_shapes(buckets, steps, settings.warmup_batch_sizes)
        t1 = time.perf_counter()
        timings = await loop.run_in_executor(
            executor, warm_up, runner, buckets, steps, settings.warmup_batch_sizes
        )
        log.info(
            "model warmed",
            extra={"load_s": round(t1 - t0, 3), "warmup_s": round(time.perf_counter() - t1, 3),
                   "shapes": len(shapes), "buckets": list(buckets), "steps": list(steps),
                   "batch_sizes": list(settings.warmup_batch_sizes)},
        )
        await service.start_engine(runner, executor, timings, buckets)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.exception("the model failed to load; /readyz stays 503")
        service.fail(f"{type(exc).__name__}: {exc}")


async def _close_connections(app: web.Application) -> None:
    app[SERVICE].begin_shutdown()
    closables = app[CLOSABLES]
    conns = list(closables)
    if conns:
        await asyncio.gather(
            *(c.close(CloseCode.GOING_AWAY, "shutdown") for c in conns), return_exceptions=True
        )
