"""Where a client follows a router or a migrate: it sends its API key and resume token
there, so only to the host it was given (and the hosts it was told to trust), and never
from wss/https down to plain ws."""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import urlsplit


def pinned(first_url: str, allowed_hosts: Collection[str] = ()) -> tuple[bool, frozenset[str]]:
    """(secure, hosts) for a client that starts at ``first_url``."""
    first = urlsplit(first_url)
    return first.scheme in ("wss", "https"), frozenset({first.hostname or "", *allowed_hosts}) - {""}


def refusal(url: object, secure: bool, hosts: Collection[str], what: str) -> str | None:
    """Why the client may not go to ``url`` (``what`` sent it there), or None."""
    parts = urlsplit(url if isinstance(url, str) else "")
    schemes = ("wss",) if secure else ("ws", "wss")
    if parts.scheme in schemes and parts.hostname in hosts:
        return None
    return (f"{what} points to {parts.scheme}://{parts.hostname}: this client goes only to "
            f"{' or '.join(schemes)} on {sorted(hosts)} (allowed_hosts)")
