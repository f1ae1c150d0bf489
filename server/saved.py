"""Saved worlds as the core sees them: the ``Worlds`` the transports and the HTTP API call, and
its routes.

server/cluster/keeper.py's ``Keeper`` implements it wherever a store is configured (``--store``);
without one the app has no ``WORLDS`` and every call here answers ``store_error`` (404).

- ``POST /v1/sessions/{id}/save`` ``{"name": ...}`` with ``X-Session-Token`` (and the API key
  when keys are set): the session saved now as a world, answered with what ``saved`` carries.
- ``GET /v1/worlds`` (the API key when keys are set): every world's public meta, oldest first.
- ``DELETE /v1/worlds/{id}``: the token of the session that saved it, or the admin key. Another
  caller gets the 404 an unknown id gets.

Errors: ``unknown_world`` 404, ``bad_world`` 422 (a bad name, another model or version, a world
that cannot be read), any other store error 503; nothing is changed by a refused call.
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from worldserve.protocol import Saved, Start, Started
from worldserve.server.auth import authorized, bearer_key, key_ok
from worldserve.server.keys import SERVICE, SETTINGS
from worldserve.server.live import Peer
from worldserve.server.store import StoreError
from worldserve.server.web import CORS, preflight
from worldserve.server.worlds import UnknownWorld, WorldError, WorldMeta

SESSION_TOKEN_HEADER = "X-Session-Token"


class Worlds(Protocol):
    """Saved worlds on the store (server/cluster/keeper.py's ``Keeper``). Store errors
    (``StoreError`` and its ``WorldError``, ``UnknownWorld``) carry their wire code."""

    async def save(self, session_id: str, name: str) -> Saved:
        """The session (held here) saved now under ``name``, owned by its current token."""
        ...

    async def fork(self, req: Start, peer: Peer, client: tuple[str, ...] = ()) -> Started:
        """A new session from the world ``req.world``, attached to ``peer``."""
        ...

    async def list(self) -> list[WorldMeta]: ...

    async def delete(self, world_id: str, token: str | None, admin: bool) -> None:
        """Delete a world: the token that saved it or ``admin``; UnknownWorld otherwise."""
        ...


WORLDS: web.AppKey[Worlds] = web.AppKey("worlds")


class NoStore(StoreError):
    def __init__(self) -> None:
        super().__init__("this server keeps no worlds: start it with --store (a directory or an fsspec URL)")


def worlds_of(app: web.Application) -> Worlds:
    worlds = app.get(WORLDS)
    if worlds is None:
        raise NoStore()
    return worlds


def store_refusal(exc: StoreError) -> web.Response:
    status = 404 if isinstance(exc, UnknownWorld | NoStore) else 422 if isinstance(exc, WorldError) else 503
    return web.json_response({"error": exc.code, "message": str(exc)}, status=status, headers=CORS)


def _unauthorized(what: str) -> web.Response:
    return web.json_response({"error": "unauthorized", "message": what}, status=401, headers=CORS)


async def save_session(request: web.Request) -> web.Response:
    sid = request.match_info["session_id"]
    settings, service = request.app[SETTINGS], request.app[SERVICE]
    token = request.headers.get(SESSION_TOKEN_HEADER)
    if token is None or not authorized(request.headers, settings.api_keys):
        return _unauthorized(f"{SESSION_TOKEN_HEADER}: <session token> (and Authorization: Bearer <api key> "
                             "when keys are set) required")
    session = service.store.peek(sid)
    if session is None or not session.check_token(token):
        return web.json_response({"error": "missing_session_state", "message": f"no session {sid!r}"},
                                 status=404, headers=CORS)
    try:
        body = await request.json() if request.can_read_body else {}
    except ValueError:
        body = None
    name = body.get("name") if isinstance(body, dict) else None
    if not isinstance(name, str):
        return web.json_response({"error": "bad_message", "message": 'a JSON body {"name": "..."} is required'},
                                 status=400, headers=CORS)
    try:
        saved = await worlds_of(request.app).save(sid, name)
    except StoreError as exc:
        return store_refusal(exc)
    return web.json_response({k: v for k, v in saved.to_wire().items() if k not in ("type", "v")}, headers=CORS)


async def list_worlds(request: web.Request) -> web.Response:
    if not authorized(request.headers, request.app[SETTINGS].api_keys):
        return _unauthorized("Authorization: Bearer <api key> required")
    try:
        metas = await worlds_of(request.app).list()
    except StoreError as exc:
        return store_refusal(exc)
    return web.json_response({"worlds": [m.public() for m in metas]}, headers=CORS)


async def delete_world(request: web.Request) -> web.Response:
    world_id = request.match_info["world_id"]
    settings = request.app[SETTINGS]
    admin = settings.admin_key is not None and key_ok(bearer_key(request.headers), (settings.admin_key,))
    token = request.headers.get(SESSION_TOKEN_HEADER)
    if not admin and token is None:
        return _unauthorized(f"{SESSION_TOKEN_HEADER}: <the token of the session that saved it>, or the admin key, "
                             "required")
    try:
        await worlds_of(request.app).delete(world_id, token, admin)
    except StoreError as exc:
        return store_refusal(exc)
    return web.json_response({"deleted": world_id}, headers=CORS)


def add_world_routes(app: web.Application) -> None:
    app.router.add_post("/v1/sessions/{session_id}/save", save_session)
    app.router.add_route("OPTIONS", "/v1/sessions/{session_id}/save", preflight("POST"))
    app.router.add_get("/v1/worlds", list_worlds)
    app.router.add_delete("/v1/worlds/{world_id}", delete_world)
    app.router.add_route("OPTIONS", "/v1/worlds/{world_id}", preflight("DELETE"))
