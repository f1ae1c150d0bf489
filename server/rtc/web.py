"""The browser client (clients/web/): ``/`` is its page, ``/web/<file>`` its scripts and
styles. Plain files, no build step; ``Cache-Control: no-cache`` so a new server version
is picked up on reload."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

WEB_DIR = Path(__file__).resolve().parents[2] / "clients" / "web"
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


async def index(request: web.Request) -> web.FileResponse:
    return _file(WEB_DIR / "index.html")


async def asset(request: web.Request) -> web.FileResponse:
    name = request.match_info["name"]
    path = WEB_DIR / name
    # Only plain files directly in clients/web: no "..", no sub-folders, no dotfiles.
    if "/" in name or name.startswith(".") or path.suffix not in _TYPES or not path.is_file():
        raise web.HTTPNotFound()
    return _file(path)


def _file(path: Path) -> web.FileResponse:
    return web.FileResponse(
        path, headers={"Cache-Control": "no-cache", "Content-Type": _TYPES[path.suffix]}
    )


def add_web_routes(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_get("/web/{name}", asset)
