"""WebRTC for browsers (aiortc), and the browser client's static files.

    setup_rtc(app)          # in create_app: routes, state, cleanup

- ``POST /v1/rtc/offer`` (server/rtc/offer.py): SDP offer in, answer out (non-trickle),
  the session opened or resumed with the same semantics as the WebSocket's ``start`` and
  ``resume``.
- The video track (track.py) sends the session's latest frame, paced on the monotonic
  clock, 90 kHz pts; the encoder (encoder.py) is x264 ultrafast+zerolatency or VP8
  realtime, one thread, a keyframe on PLI.
- Data channels (peer.py): ``actions`` (client -> server, unordered, no retransmits) and
  ``control`` (reliable; protocol v1 messages, msgpack, as on the WebSocket).
- ICE (ice.py): no STUN/TURN unless configured; 127.0.0.1 candidates on loopback-only
  boxes.
- ``/`` and ``/web/*`` (server/web.py): the browser client in clients/web/.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from worldserve.server.keys import METRICS
from worldserve.server.rtc.keys import RTC_METRICS, RTC_PEERS, RTC_SETTINGS
from worldserve.server.rtc.metrics import RtcMetrics
from worldserve.server.rtc.offer import offer_handler, offer_preflight
from worldserve.server.rtc.peer import RtcPeer
from worldserve.server.settings import IceServer, RtcSettings
from worldserve.server.web import add_web_routes

__all__ = ["IceServer", "RtcSettings", "setup_rtc"]


def setup_rtc(app: web.Application, settings: RtcSettings | None = None) -> None:
    """Register the WebRTC offer route, the browser client's files and the cleanup of
    leftover peer connections. ``settings`` None: ``RtcSettings()`` (create_app passes
    ``Settings.rtc``, the ``--rtc-*`` flags); they are read per request, so
    ``app[RTC_SETTINGS]`` may be replaced until the app starts. Call after ``app[METRICS]``
    is set (create_app does that first)."""
    rtc = settings if settings is not None else RtcSettings()
    app[RTC_SETTINGS] = rtc
    app[RTC_METRICS] = RtcMetrics(app[METRICS].registry)
    app[RTC_PEERS] = set()
    app.router.add_post("/v1/rtc/offer", offer_handler)  # 404 rtc_disabled when disabled
    app.router.add_route("OPTIONS", "/v1/rtc/offer", offer_preflight)
    add_web_routes(app)
    app.on_cleanup.append(_close_peers)


async def _close_peers(app: web.Application) -> None:
    """Peers still open at cleanup (e.g. mid-offer when shutdown began)."""
    held: set[RtcPeer] = app[RTC_PEERS]
    if held:
        await asyncio.gather(*(p.close() for p in list(held)), return_exceptions=True)
