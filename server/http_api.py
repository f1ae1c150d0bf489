"""HTTP endpoints: health, readiness, metrics, load for routers, session delete, drain, and
a session's replay log (``GET /admin/sessions/{id}/log``, for ``worldserve replay``).

``/v1/load`` and ``DELETE /v1/sessions/{id}`` (the session's token or the admin key) answer any
origin (``server.web.CORS``): the browser client, served by a router or by another worker, reads the
first to pick a bucket and sends the second when its page closes."""

from __future__ import annotations

import asyncio

from aiohttp import web

from worldserve.server.auth import authorized, bearer_key, key_ok
from worldserve.server.keys import AGENT, METRICS, SERVICE, SETTINGS
from worldserve.server.metrics import CONTENT_TYPE_LATEST
from worldserve.server.web import CORS, preflight
from worldserve.session import logfile


async def healthz(request: web.Request) -> web.Response:
    """The process is alive and its loop answers (not that it can take sessions)."""
    return web.json_response({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    """200 when a new session can be taken; 503 while warming, full, draining or failed."""
    ok, why = request.app[SERVICE].readiness()
    return web.json_response({"ready": ok, "reason": why}, status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def load(request: web.Request) -> web.Response:
    """What a router needs to place a session: counts, capacity, utilisation, state; and the
    recipe a Wan model serves (model/wan/recipes.py)."""
    service = request.app[SERVICE]
    body = service.load()
    recipe = service.engine.runner.capabilities.recipe if service.engine else None
    if recipe is not None:
        body["recipe"] = recipe
    return web.json_response(body, headers=CORS)


SESSION_TOKEN_HEADER = "X-Session-Token"


async def delete_session(request: web.Request) -> web.Response:
    """End a session (its client is told ``ended: deleted``). Needs the session's token
    (``X-Session-Token``, and the API key when keys are set) or the admin key. A caller
    without the admin key gets the same 404 for an unknown id and a wrong token, so the
    answer never says whether an id exists."""
    settings = request.app[SETTINGS]
    sid = request.match_info["session_id"]
    service = request.app[SERVICE]
    admin = settings.admin_key is not None and key_ok(bearer_key(request.headers), (settings.admin_key,))
    if not admin:
        token = request.headers.get(SESSION_TOKEN_HEADER)
        if token is None or not authorized(request.headers, settings.api_keys):
            return web.json_response(
                {"error": "unauthorized", "message": f"{SESSION_TOKEN_HEADER}: <session token> (and "
                 "Authorization: Bearer <api key> when keys are set), or the admin key, required"},
                status=401, headers=CORS,
            )
        session = service.store.peek(sid)
        if session is None or not session.check_token(token):
            return _no_session(sid)
    if not service.close(sid, "deleted"):
        return _no_session(sid)
    return web.json_response({"deleted": sid}, headers=CORS)


def _no_session(sid: str) -> web.Response:
    return web.json_response(
        {"error": "missing_session_state", "message": f"no session {sid!r}"}, status=404, headers=CORS,
    )


def _admin_refusal(request: web.Request) -> web.Response | None:
    """404 when no admin key is configured, 401 without it; None: go on."""
    key = request.app[SETTINGS].admin_key
    if key is None:
        return web.json_response(
            {"error": "not_found", "message": "the admin API is off (start with --admin-key)"},
            status=404,
        )
    if not key_ok(bearer_key(request.headers), (key,)):
        return web.json_response(
            {"error": "unauthorized", "message": "Authorization: Bearer <admin key> required"},
            status=401,
        )
    return None


async def session_log(request: web.Request) -> web.Response:
    """A session's replay log (session/logfile.py), msgpack; ``worldserve replay`` reads it.
    Needs ``Authorization: Bearer <admin key>``."""
    refusal = _admin_refusal(request)
    if refusal is not None:
        return refusal
    sid = request.match_info["session_id"]
    service = request.app[SERVICE]
    session = service.store.peek(sid)
    if session is None:
        return web.json_response(
            {"error": "missing_session_state", "message": f"no session {sid!r} on this worker"},
            status=404,
        )
    settings = request.app[SETTINGS]
    caps = service.engine.runner.capabilities if service.engine else None
    dtype = caps.dtype if caps is not None else settings.dtype
    reference = caps.reference if caps is not None else ""
    captured = logfile.capture(session, settings.model, dtype, reference)  # cheap, on the loop
    body = await asyncio.get_running_loop().run_in_executor(None, logfile.encode, captured)
    return web.Response(body=body, content_type="application/msgpack")


async def drain(request: web.Request) -> web.Response:
    """Start draining (hand every session to another worker, then exit). Needs
    ``Authorization: Bearer <admin key>``; 404 when no admin key is configured."""
    refusal = _admin_refusal(request)
    if refusal is not None:
        return refusal
    agent = request.app.get(AGENT)
    if agent is None:
        return web.json_response(
            {"error": "not_found", "message": "this server has no drain (built without an agent)"},
            status=404,
        )
    agent.begin_drain()
    sessions = len(request.app[SERVICE].sessions())
    return web.json_response(
        {"draining": True, "worker_id": agent.worker_id, "sessions": sessions}, status=202
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/load", load)
    app.router.add_delete("/v1/sessions/{session_id}", delete_session)
    app.router.add_route("OPTIONS", "/v1/sessions/{session_id}", preflight("DELETE"))
    app.router.add_post("/admin/drain", drain)
    app.router.add_get("/admin/sessions/{session_id}/log", session_log)
