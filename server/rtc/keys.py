"""Typed keys of the WebRTC state on the aiohttp application (server/keys.py holds the
server's own)."""

from __future__ import annotations

from aiohttp import web

from worldserve.server.rtc.metrics import RtcMetrics
from worldserve.server.rtc.peer import RtcPeer
from worldserve.server.settings import RtcSettings

RTC_SETTINGS = web.AppKey("rtc_settings", RtcSettings)
RTC_METRICS = web.AppKey("rtc_metrics", RtcMetrics)
# Every peer connection from its offer until it is closed (on_cleanup closes leftovers).
RTC_PEERS = web.AppKey("rtc_peers", set[RtcPeer])
