"""API-key checks shared by the WebSocket, the WebRTC offer, the HTTP API and the router.

A key comes either from a message field (``api_key`` of ``start``) or from an
``Authorization: Bearer <key>`` header; a field, when present, wins over the header. The
comparison is constant-time and runs against every configured key, so the time taken says
nothing about which key (if any) was close. Each endpoint keeps its own error response.
"""

from __future__ import annotations

import hmac
from collections.abc import Collection, Mapping

_BEARER = "Bearer "


def bearer_key(headers: Mapping[str, str]) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header; None when there is no such
    header (another scheme, or none). ``Bearer `` with nothing after it gives ``""``."""
    header = headers.get("Authorization", "")
    return header[len(_BEARER):] if header.startswith(_BEARER) else None


def presented_key(headers: Mapping[str, str], field: str | None = None) -> str | None:
    """The key a client presented: the message field when set, else the Bearer header."""
    return field if field is not None else bearer_key(headers)


def key_ok(key: str | None, keys: Collection[str]) -> bool:
    """Whether ``key`` is one of ``keys``. No keys configured: always true. A missing or
    empty key never matches."""
    if not keys:
        return True
    presented = (key or "").encode()
    ok = False
    for k in keys:  # compare with every key: the time says nothing about which is close
        ok |= hmac.compare_digest(presented, k.encode())
    return ok and bool(presented)


def authorized(
    headers: Mapping[str, str], keys: Collection[str], field: str | None = None
) -> bool:
    """:func:`key_ok` for the key the request presented (``field`` first, then the header)."""
    return key_ok(presented_key(headers, field), keys)
