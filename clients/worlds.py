"""Saved worlds from the SDK: save a client's session, list, delete, and fork a new session from one.

    async with WorldClient(url) as client:
        await client.start("a snowy forest")
        ...
        saved = await save(client, "snowy forest, by the lake")   # protocol.Saved
    worlds = await list_worlds(url)                                 # [{"id", "name", "frames", ...}]
    async with WorldClient(url) as other:
        started = await fork(other, saved.world)    # a new session at the world's block (started.block_idx)
        async for ev in other.frames(): ...

``save`` uses ``POST /v1/sessions/{id}/save`` with the session's current token (the SDK keeps the
one each resume hands out); the world is owned by that token: ``delete_world(url, id,
token=client.started.token)`` or the admin key deletes it. A refusal raises ``WorldRefused``
with the server's error code (``unknown_world``, ``bad_world``, ``store_error`` ...).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from worldserve.clients.sdk import SessionEnded, WorldClient
from worldserve.protocol import Codec, Mode, Saved, Start, Started


class WorldRefused(Exception):
    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(f"{code}: {message}")


def http_base(url: str) -> str:
    """``ws://host:port/v1/ws`` (or an http URL) -> ``http://host:port``."""
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "", "", ""))


async def _call(method: str, url: str, headers: dict[str, str], http: aiohttp.ClientSession | None,
                body: Any = None) -> Any:
    own = http is None
    session = http or aiohttp.ClientSession()
    try:
        async with session.request(method, url, headers=headers, json=body) as resp:
            doc = await resp.json(content_type=None)
            if resp.status != 200:
                raise WorldRefused(str(doc.get("error", resp.status)), str(doc.get("message", "")))
            return doc
    finally:
        if own:
            await session.close()


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def save(client: WorldClient, name: str, *, http: aiohttp.ClientSession | None = None) -> Saved:
    """Save ``client``'s session now as a world named ``name``."""
    st = client.started
    if st is None:
        raise SessionEnded("no session to save: start one first")
    headers = {**_auth(client.api_key), "X-Session-Token": st.token}
    doc = await _call("POST", f"{http_base(client.url)}/v1/sessions/{st.session_id}/save", headers, http,
                      {"name": name})
    return Saved(doc["world"], doc["name"], doc["frames"], doc["block_idx"])


async def list_worlds(url: str, *, api_key: str | None = None,
                      http: aiohttp.ClientSession | None = None) -> list[dict[str, Any]]:
    """Every world the server at ``url`` keeps (public meta), oldest first."""
    doc = await _call("GET", f"{http_base(url)}/v1/worlds", _auth(api_key), http)
    return list(doc["worlds"])


async def delete_world(url: str, world_id: str, *, token: str | None = None, admin_key: str | None = None,
                       http: aiohttp.ClientSession | None = None) -> None:
    """Delete a world: ``token``, the token of the session that saved it, or the admin key."""
    headers = {**_auth(admin_key), **({"X-Session-Token": token} if token else {})}
    await _call("DELETE", f"{http_base(url)}/v1/worlds/{world_id}", headers, http)


async def fork(client: WorldClient, world_id: str, *, codec: Codec = "jpeg", mode: Mode = "push",
               lookahead: int = 1, quality: int | None = None, deadline_ms: float | None = None,
               timeout: float = 30.0) -> Started:
    """Open ``client``'s session as a fork of the world ``world_id``: the world's prompt, seed, size
    and rate, its state at ``started.block_idx``; refused: ``SessionEnded`` with the server's error.
    Given the same actions it makes the frames the saved session made from there."""
    if client.started is not None:
        raise SessionEnded("this client holds a session already: fork with another WorldClient")
    msg = Start(codec=codec, mode=mode, lookahead=lookahead, quality=quality, deadline_ms=deadline_ms,
                api_key=client.api_key, world=world_id)
    await client._open()
    reply = await client._request(msg, timeout)
    if not isinstance(reply, Started):
        raise SessionEnded(f"fork refused: {reply!r}")
    client.started = reply
    client._next_block = reply.block_idx  # the stream goes on at the world's block
    if mode == "pull":
        client._requested = reply.block_idx  # the server makes the first block unasked
    client._connected.set()
    return reply
