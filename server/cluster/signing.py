"""Hand-offs and worker records signed with the cluster's secret, and the worker addresses
a cluster trusts.

The directory (Redis) is shared by every worker and router; anyone who can write to it
could plant a hand-off that takes over a session or a worker address that routers hand
out and drains send clients to. With a cluster secret (``--cluster-secret`` or
``WORLDSERVE_CLUSTER_SECRET``, the same on every worker) each hand-off a worker stores is
``MAGIC + HMAC-SHA256(secret, session_id NUL blob) + blob``, and a worker adopts only one
whose tag matches, for that session. Each worker record carries ``signature``, the HMAC of
its id, address and instance, and routers and draining workers place sessions only on
workers whose signature checks (``trusted_workers``), so a record planted in Redis gets no
client. Addresses: ``--allowed-workers`` (host or host:port, comma-separated) limits the
workers a router places on and a draining worker migrates to.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection
from dataclasses import replace
from urllib.parse import urlsplit

from worldserve.server.cluster.directory import Directory, WorkerInfo
from worldserve.session.handoff import HandoffError

MAGIC = b"WSHMAC1\0"
_TAG = 32


class BadSignature(HandoffError):
    """A hand-off without the cluster's signature, or signed for another session."""


def _tag(secret: str, session_id: str, blob: bytes) -> bytes:
    return hmac.new(secret.encode(), session_id.encode() + b"\0" + blob, hashlib.sha256).digest()


def sign(secret: str | None, session_id: str, blob: bytes) -> bytes:
    """``blob`` as stored: signed when the cluster has a secret, else as it is."""
    if not secret:
        return blob
    return MAGIC + _tag(secret, session_id, blob) + blob


def verify(secret: str | None, session_id: str, data: bytes) -> bytes:
    """The blob of a stored hand-off; BadSignature when the cluster has a secret and the
    tag is missing or wrong. Without a secret a signed blob is read as well (a cluster
    turning signing on or off mid-way loses no session)."""
    signed = data.startswith(MAGIC) and len(data) >= len(MAGIC) + _TAG
    blob = data[len(MAGIC) + _TAG:] if signed else data
    if secret:
        tag = data[len(MAGIC):len(MAGIC) + _TAG] if signed else b""
        if not hmac.compare_digest(tag, _tag(secret, session_id, blob)):
            raise BadSignature(f"hand-off of session {session_id!r} is not signed with the cluster secret")
    return blob


def address_allowed(address: str, allowed: Collection[str]) -> bool:
    """Whether a worker's advertised address is one the cluster trusts (no list: any)."""
    if not allowed:
        return True
    parts = urlsplit(address)
    host = parts.hostname or ""
    return host in allowed or f"{host}:{parts.port}" in allowed


def _worker_tag(secret: str, info: WorkerInfo) -> str:
    fields = "\0".join(("worker", info.worker_id, info.address, info.instance))
    return hmac.new(secret.encode(), fields.encode(), hashlib.sha256).hexdigest()


def sign_worker(secret: str | None, info: WorkerInfo) -> WorkerInfo:
    """The worker's record as it registers: with its signature when the cluster has a secret."""
    return replace(info, signature=_worker_tag(secret, info)) if secret else info


def worker_trusted(info: WorkerInfo, secret: str | None, allowed: Collection[str]) -> bool:
    """Whether sessions may go to this worker: its address allowed and, with a secret, its
    record signed with it."""
    if not address_allowed(info.address, allowed):
        return False
    return not secret or hmac.compare_digest(info.signature, _worker_tag(secret, info))


async def trusted_workers(directory: Directory, secret: str | None, allowed: Collection[str]) -> set[str] | None:
    """The ids of the live workers sessions may be placed on (``place_session``'s ``among``);
    None when the cluster has neither a secret nor an allow-list (every worker is)."""
    if not secret and not allowed:
        return None
    return {w.worker_id for w in await directory.list_workers() if worker_trusted(w, secret, allowed)}
