"""``worldserve router``: where a session should run, and where it continues.

Signaling only: a client asks the router, then talks to the worker directly; media never
flows through here. State lives in the session directory (Redis), so routers are
stateless and any number of them can run side by side.

- ``POST /v1/place`` → ``{"session_id", "worker_id", "url", "address"}``: a reservation
  (a fresh session id) on the least-loaded serving worker below ``threshold``, made with
  ``Directory.place_session`` (atomic: two routers never take a worker's last slot). The
  client connects to ``url`` and sends ``start`` with ``session_id``. 503 with
  ``retry_after`` (and ``Retry-After``) when no worker has room or the directory is down.
  The reservation is a ``reserved`` record in the directory: the worker's ``start`` claims
  it, once; one nobody claims within ``reservation_ttl_s`` is deleted by the directory
  itself (no router needs to outlive it).
- ``POST /v1/resume`` ``{"session_id"}`` → the same shape plus ``state``: the worker that
  holds the session, or will restore it. A session on a dead worker (its heartbeat TTL
  ran out) or orphaned is placed on a live worker, which restores it from its last
  checkpoint when the client resumes there; without a snapshot it is 404. The re-placed
  record is ``migrating``: a client that does not resume there within ``handover_ttl_s``
  does not keep that worker's slot (the session is orphaned again, and can be re-placed
  again while its snapshot lasts).
- ``GET /v1/workers`` (live workers), ``/healthz``, ``/readyz`` (200 while the directory
  answers and at least one worker is serving), ``/metrics`` (Prometheus text: placements
  and resume lookups by outcome, signaling requests by endpoint and status, directory
  errors, live workers by state; server/metrics.py ``RouterMetrics``).

API keys (``api_keys``) guard ``/v1/place`` like a worker's ``start``; resume needs none
(the session's token, checked by the worker, is what guards it).

The router also serves the browser client (server/web.py: ``/``, ``/web/*``), and its
``GET /web/config`` says ``{"mode": "router"}``: the page places its session here, opens
it at the worker named, and asks ``/v1/resume`` where to go on after a dropped connection
or a ``migrate`` with no target. ``/v1/place`` and ``/v1/resume`` answer any origin
(``Access-Control-Allow-Origin: *`` and their ``OPTIONS`` preflight), so a page served
elsewhere may use them too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, replace
from typing import Any

from aiohttp import web

from worldserve.protocol.vocab import SESSION_ID_RE
from worldserve.server.auth import authorized, bearer_key
from worldserve.server.cluster.agent import ws_url
from worldserve.server.cluster.directory import (
    HANDOVER_TTL_S,
    ORPHAN_TTL_S,
    Directory,
    DirectoryError,
    DirectoryUnavailable,
    NoWorkerAvailable,
    SessionState,
    UnknownSession,
    WorkerInfo,
    WorkerState,
    open_directory,
)
from worldserve.server.cluster.signing import trusted_workers, worker_trusted
from worldserve.server.metrics import CONTENT_TYPE_LATEST, RouterMetrics
from worldserve.server.quotas import OverQuota, Quotas, clients
from worldserve.server.settings import setting
from worldserve.server.web import CORS, add_web_routes, preflight

log = logging.getLogger("worldserve.router")


@dataclass(frozen=True, slots=True)
class RouterSettings:
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(8080, "TCP port to listen on")
    directory_url: str = setting("redis://127.0.0.1:6379/0", "the workers' session directory")
    directory_prefix: str = setting("worldserve", "key prefix in the directory: the workers'")
    threshold: float = setting(0.9, "place sessions only on workers whose utilisation is below this")
    api_keys: frozenset[str] = setting(frozenset(), "API keys for /v1/place, comma-separated "
                                                    "(empty: no key needed)")
    reservation_ttl_s: float = setting(30.0, "a reservation no worker took up is released after "
                                             "this, seconds")
    maintenance_s: float = setting(1.0, "seconds between reaping dead workers and stale reservations")
    allowed_workers: frozenset[str] = setting(frozenset(), "hosts (host or host:port) the router places "
                                                           "on and resumes at, comma-separated (empty: any)")
    cluster_secret: str | None = setting(None, "the workers' cluster secret: place only on workers whose "
                                               "record is signed with it (set it via "
                                               "WORLDSERVE_CLUSTER_SECRET)")
    quota_places_per_s: float = setting(5.0, "places a client (address, and API key) may make per second")
    quota_place_burst: int = setting(20, "places a client may make at once")
    retry_after_s: float = setting(1.0, "the retry_after a 503 during a directory outage says, seconds")
    orphan_ttl_s: float = setting(ORPHAN_TTL_S, "seconds the directory keeps the record of a session "
                                                "whose worker died; give the workers the same")
    handover_ttl_s: float = setting(HANDOVER_TTL_S, "seconds a re-placed session holds its new "
                                                    "worker's slot waiting for its client; give the "
                                                    "workers the same")
    log_format: str = setting("kv", "log lines as key=value (kv) or JSON (json)")
    log_level: str = setting("INFO", "log level: DEBUG, INFO, WARNING, ERROR")

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"bad setting: port {self.port!r} must be in [0, 65535]")
        if self.quota_place_burst < 1:
            raise ValueError(f"bad setting: quota_place_burst {self.quota_place_burst!r} must be >= 1")
        for name in ("threshold", "reservation_ttl_s", "maintenance_s", "retry_after_s", "quota_places_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"bad setting: {name} {getattr(self, name)!r} must be > 0")
        for name in ("orphan_ttl_s", "handover_ttl_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"bad setting: {name} {v!r} must be finite and > 0")


class Router:
    """Placement and resume lookups over a ``Directory``."""

    def __init__(
        self, settings: RouterSettings, directory: Directory, metrics: RouterMetrics | None = None
    ) -> None:
        self.settings = settings
        self.directory = directory
        self.metrics = metrics if metrics is not None else RouterMetrics()
        self.quotas = Quotas(settings.quota_places_per_s, settings.quota_place_burst)

    async def place(self) -> dict[str, Any]:
        """Reserve a slot for a new session (NoWorkerAvailable / DirectoryUnavailable)."""
        sid = secrets.token_urlsafe(12)
        try:
            worker = await self.directory.place_session(sid, self.settings.threshold,
                                                        reserve_s=self.settings.reservation_ttl_s,
                                                        among=await self._trusted())
        except NoWorkerAvailable:
            self.metrics.placements.labels("refused").inc()
            raise
        except DirectoryError:
            self.metrics.placements.labels("failed").inc()
            self.directory_failed("place")
            raise
        self.metrics.placements.labels("placed").inc()
        log.info("placed", extra={"sid": sid, "worker_id": worker.worker_id, "load": worker.load})
        return _answer(sid, worker)

    async def locate(self, sid: str) -> dict[str, Any] | None:
        """Where ``sid`` continues; None if the directory does not know it (or its worker
        died with no snapshot to restore it from)."""
        try:
            found, outcome = await self._locate(sid)
        except NoWorkerAvailable:
            self.metrics.resumes.labels("refused").inc()
            raise
        except DirectoryError:
            self.metrics.resumes.labels("failed").inc()
            self.directory_failed("resume")
            raise
        self.metrics.resumes.labels(outcome).inc()
        return found

    async def _locate(self, sid: str) -> tuple[dict[str, Any] | None, str]:
        rec = await self.directory.get_session(sid)
        if rec is None:
            return None, "missing"
        worker = await self.directory.get_worker(rec.worker_id)
        if worker is not None and not worker_trusted(worker, self.settings.cluster_secret,
                                                     self.settings.allowed_workers):
            log.warning("worker %s (%s) is not allowed or its record is not signed with the cluster secret",
                        worker.worker_id, worker.address)
            return None, "missing"
        if worker is not None and rec.state is not SessionState.ORPHANED:
            return {**_answer(sid, worker), "state": rec.state.value}, "found"
        if rec.state is not SessionState.ORPHANED:  # its worker died: orphan what it held
            reaped = await self.directory.reap_dead_workers()
            if reaped:
                log.warning("reaped dead workers", extra={"workers": ",".join(sorted(reaped))})
        if await self.directory.get_snapshot(sid) is None:
            return None, "missing"
        worker = await self.directory.place_session(sid, self.settings.threshold, among=await self._trusted())
        # A handover, not a session running there: it holds the slot for a while only
        # (place_session kept the epoch and block_idx read above).
        handover = replace(rec, worker_id=worker.worker_id, state=SessionState.MIGRATING)
        with suppress(UnknownSession, ValueError):  # moved or released meanwhile
            await self.directory.update_session(handover)
        log.info("re-placed", extra={"sid": sid, "worker_id": worker.worker_id,
                                     "from_worker": rec.worker_id})
        return {**_answer(sid, worker), "state": SessionState.MIGRATING.value}, "re_placed"

    async def _trusted(self) -> set[str] | None:
        """The workers sessions may go to (signed, allowed); None: any."""
        return await trusted_workers(self.directory, self.settings.cluster_secret, self.settings.allowed_workers)

    async def scrape(self) -> bytes:
        """The /metrics body, with the worker gauges read from the directory now."""
        m = self.metrics
        try:
            workers = await self.directory.list_workers()
        except DirectoryError:
            self.directory_failed("metrics")
            m.directory_up.set(0)
            m.workers.clear()  # unknown: no series rather than stale ones
        else:
            m.directory_up.set(1)
            by_state = Counter(w.state for w in workers)
            for state in WorkerState:
                m.workers.labels(state.value).set(by_state[state])
        return m.render()

    def directory_failed(self, operation: str) -> None:
        """Count a directory call that failed (the caller answers 503 or retries)."""
        self.metrics.directory_errors.labels(operation).inc()

    async def maintain(self) -> None:
        """Reap dead workers (their sessions become orphaned); the directory drops, as it
        does so, the handovers and reservations whose time ran out."""
        await self.directory.reap_dead_workers()


def _answer(sid: str, worker: WorkerInfo) -> dict[str, Any]:
    return {
        "session_id": sid,
        "worker_id": worker.worker_id,
        "url": ws_url(worker.address),
        "address": worker.address,
    }


ROUTER = web.AppKey("router", Router)

SIGNALING = frozenset({"/v1/place", "/v1/resume", "/v1/workers"})  # counted by endpoint
BROWSER = frozenset({"/v1/place", "/v1/resume"})  # what the browser client calls: any origin


def create_router(settings: RouterSettings, *, directory: Directory | None = None) -> web.Application:
    app = web.Application(middlewares=[_count_signaling, _cors])
    if directory is None:
        directory = open_directory(settings.directory_url, prefix=settings.directory_prefix,
                                   orphan_ttl_s=settings.orphan_ttl_s,
                                   handover_ttl_s=settings.handover_ttl_s)
    app[ROUTER] = Router(settings, directory)
    app.router.add_post("/v1/place", _place)
    app.router.add_post("/v1/resume", _resume)
    app.router.add_get("/v1/workers", _workers)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    for path in BROWSER:
        app.router.add_route("OPTIONS", path, preflight("POST"))
    add_web_routes(app, "router")
    app.cleanup_ctx.append(_maintenance_ctx)
    return app


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _count_signaling(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count each signaling request by endpoint and HTTP status (errors included; CORS
    preflights are not signaling)."""
    if request.path not in SIGNALING or request.method == "OPTIONS":
        return await handler(request)
    requests = request.app[ROUTER].metrics.requests
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        requests.labels(request.path, str(exc.status)).inc()
        raise
    except Exception:
        requests.labels(request.path, "500").inc()
        raise
    requests.labels(request.path, str(response.status)).inc()
    return response


@web.middleware
async def _cors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``Access-Control-Allow-Origin: *`` on the answers of the endpoints in ``BROWSER``."""
    response = await handler(request)
    if request.path in BROWSER:
        response.headers.update(CORS)
    return response


async def _place(request: web.Request) -> web.Response:
    router = request.app[ROUTER]
    if not authorized(request.headers, router.settings.api_keys):
        return _error(401, "unauthorized", "Authorization: Bearer <api key> required")
    try:
        router.quotas.take(clients(request.remote, bearer_key(request.headers)))
    except OverQuota as exc:
        return _error(429, exc.code, str(exc), exc.retry_after_s)
    try:
        return web.json_response(await router.place())
    except NoWorkerAvailable as exc:
        return _error(503, exc.code, str(exc), exc.retry_after_s)
    except DirectoryError as exc:
        return _directory_down(exc, router.settings.retry_after_s)


async def _resume(request: web.Request) -> web.Response:
    router = request.app[ROUTER]
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    sid = body.get("session_id") if isinstance(body, dict) else None
    if not isinstance(sid, str) or SESSION_ID_RE.fullmatch(sid) is None:
        router.metrics.resumes.labels("bad_request").inc()
        return _error(400, "bad_message", 'expected {"session_id": "<id>"}')
    try:
        found = await router.locate(sid)
    except NoWorkerAvailable as exc:
        return _error(503, exc.code, str(exc), exc.retry_after_s)
    except DirectoryError as exc:
        return _directory_down(exc, router.settings.retry_after_s)
    if found is None:
        return _error(404, "missing_session_state",
                      f"no session {sid!r} (or its worker died with no snapshot of it)")
    return web.json_response(found)


async def _workers(request: web.Request) -> web.Response:
    router = request.app[ROUTER]
    try:
        workers = await router.directory.list_workers()
    except DirectoryError as exc:
        router.directory_failed("workers")
        return _directory_down(exc, router.settings.retry_after_s)
    return web.json_response({"workers": [asdict(w) for w in workers]})


async def _metrics(request: web.Request) -> web.Response:
    body = await request.app[ROUTER].scrape()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _readyz(request: web.Request) -> web.Response:
    try:
        workers = await request.app[ROUTER].directory.list_workers()
    except DirectoryUnavailable as exc:
        request.app[ROUTER].directory_failed("readyz")
        log.warning("directory unavailable: %s", exc)
        return web.json_response({"ready": False, "reason": "directory unavailable"}, status=503)
    serving = sum(w.state is WorkerState.SERVING for w in workers)
    ok = serving > 0
    return web.json_response(
        {"ready": ok, "reason": "ready" if ok else "no serving worker", "serving": serving},
        status=200 if ok else 503,
    )


async def _maintenance_ctx(app: web.Application) -> AsyncIterator[None]:
    router = app[ROUTER]

    async def loop() -> None:
        try:
            while True:
                await asyncio.sleep(router.settings.maintenance_s)
                try:
                    await router.maintain()
                except DirectoryError:
                    router.directory_failed("maintain")  # the next round tries again
                except Exception:
                    log.exception("router maintenance failed")
        except asyncio.CancelledError:
            pass

    task = asyncio.create_task(loop(), name="router-maintenance")
    yield
    task.cancel()
    with suppress(asyncio.CancelledError):
        await task
    await router.directory.close()


def _directory_down(exc: DirectoryError, retry_after: float) -> web.Response:
    """503 for a directory failure; its text (the Redis address) stays in the log."""
    log.warning("directory unavailable: %s", exc)
    return _error(503, exc.code, "the session directory cannot be reached; retry later", retry_after)


def _error(status: int, code: str, message: str, retry_after: float | None = None) -> web.Response:
    body: dict[str, Any] = {"error": code, "message": message}
    headers = {}
    if retry_after is not None:
        body["retry_after"] = retry_after
        headers["Retry-After"] = str(max(1, round(retry_after)))
    return web.json_response(body, status=status, headers=headers)
