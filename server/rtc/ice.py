"""ICE configuration: the servers from the settings, and the loopback workaround.

aioice (0.13, pinned in pyproject.toml) gathers host candidates from every interface
except 127.0.0.1, so on a box whose only interface is loopback a peer on the same box
never connects. ``add_loopback_candidates(pc)`` makes this peer connection's gatherers
offer 127.0.0.1 too: it wraps each gatherer's ``get_component_candidates`` (instance
attributes, nothing process-wide). It must run after the transports exist (after
``setRemoteDescription``) and before gathering (``setLocalDescription``). The browser side
needs ``--allow-loopback-in-peer-connection`` for the same reason.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import ifaddr
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection

from worldserve.server.settings import Loopback, RtcSettings

log = logging.getLogger("worldserve.rtc")

LOOPBACK = "127.0.0.1"


def rtc_configuration(settings: RtcSettings) -> RTCConfiguration:
    """The peer connection's configuration. Always an explicit list: ``None`` would make
    aiortc use a public STUN server."""
    servers = [
        RTCIceServer(list(s.urls), username=s.username, credential=s.credential)
        for s in settings.ice_servers
    ]
    return RTCConfiguration(iceServers=servers)


def only_loopback() -> bool:
    """True when no interface has an IPv4 address other than loopback (nor a routable
    IPv6 one): aioice would offer no candidate at all."""
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str):
                if not ipaddress.ip_address(ip.ip).is_loopback:
                    return False
            elif not ipaddress.ip_address(ip.ip[0]).is_loopback and ip.ip[2] == 0:
                return False
    return True


def wants_loopback(mode: Loopback) -> bool:
    if mode == "always":
        return True
    if mode == "never":
        return False
    return only_loopback()


def add_loopback_candidates(pc: RTCPeerConnection) -> int:
    """Make ``pc``'s ICE gatherers offer 127.0.0.1; returns how many were changed."""
    changed = 0
    for conn in _ice_connections(pc):
        original = conn.get_component_candidates
        if getattr(original, "_worldserve_loopback", False):
            continue
        conn.get_component_candidates = _with_loopback(original)
        changed += 1
    if not changed:
        log.warning("loopback candidates: no ICE gatherer found to change")
    return changed


def _with_loopback(original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(original)
    async def get_component_candidates(component: int, addresses: list[str], *a: Any, **kw: Any) -> Any:
        if LOOPBACK not in addresses:
            addresses = [*addresses, LOOPBACK]
        return await original(component, addresses, *a, **kw)

    get_component_candidates._worldserve_loopback = True  # type: ignore[attr-defined]
    return get_component_candidates


def _ice_connections(pc: RTCPeerConnection) -> list[Any]:
    """The aioice ``Connection`` of every ICE transport of ``pc`` (media and SCTP)."""
    dtls = [t.sender.transport for t in pc.getTransceivers()]
    if pc.sctp is not None:
        dtls.append(pc.sctp.transport)
    seen: dict[int, Any] = {}
    for d in dtls:
        conn = getattr(d.transport.iceGatherer, "_connection", None)
        if conn is not None:
            seen[id(conn)] = conn
    return list(seen.values())
