"""The browser client (clients/web/): ``/`` is its page, ``/web/<file>`` its scripts and
styles, ``/web/config`` what the page needs to know about the server that served it.
Plain files, no build step; ``Cache-Control: no-cache`` so a new server version is
picked up on reload.

Workers serve it (server/rtc/) and so does the router (server/cluster/router.py). ``GET
/web/config`` answers ``{"mode": "worker"}`` on a worker (the page opens sessions right
there) and ``{"mode": "router"}`` on a router (the page places sessions through the
router's ``POST /v1/place`` and opens them at the worker it names).

Cross-origin: a page served by a router (or by a worker, after a migration) talks to
other workers; ``CORS`` is the header those endpoints add (any origin: nothing rides on
cookies, a session's token and API keys travel in bodies and headers), and
``preflight(methods)`` answers their ``OPTIONS``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal

from aiohttp import web

WEB_DIR = Path(__file__).resolve().parents[1] / "clients" / "web"
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".png": "image/png"}

CORS = {"Access-Control-Allow-Origin": "*"}

Mode = Literal["worker", "router"]


def preflight(methods: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An ``OPTIONS`` handler allowing ``methods`` from any origin."""

    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=204, headers={
            **CORS,
            "Access-Control-Allow-Methods": methods,
            "Access-Control-Allow-Headers": "Content-Type, Authorization, X-Session-Token",
            "Access-Control-Max-Age": "600",
        })

    return handler


async def index(request: web.Request) -> web.FileResponse:
    return _file(WEB_DIR / "index.html")


async def asset(request: web.Request) -> web.FileResponse:
    name = request.match_info["name"]
    path = WEB_DIR / name
    # Only plain files directly in clients/web: no "..", no sub-folders, no dotfiles. Whether
    # the file is there is FileResponse's to find out, off the loop (a missing one is a 404).
    if "/" in name or name.startswith(".") or path.suffix not in _TYPES:
        raise web.HTTPNotFound()
    return _file(path)


def _file(path: Path) -> web.FileResponse:
    return web.FileResponse(
        path, headers={"Cache-Control": "no-cache", "Content-Type": _TYPES[path.suffix]}
    )


def add_web_routes(app: web.Application, mode: Mode = "worker") -> None:
    config = {"mode": mode}

    async def page_config(request: web.Request) -> web.Response:
        return web.json_response(config, headers={"Cache-Control": "no-cache"})

    app.router.add_get("/", index)
    app.router.add_get("/web/config", page_config)  # before /web/{name}
    app.router.add_get("/web/{name}", asset)
