"""ICE: no STUN/TURN by default, servers from settings, and the loopback workaround."""

from __future__ import annotations

import argparse
import json
from typing import Any

import aioice.ice
import ifaddr
import pytest

from tests.rtc.harness import serve_rtc
from worldserve.bench._rtc_client import RtcClient
from worldserve.server.flags import build
from worldserve.server.rtc import IceServer, RtcSettings
from worldserve.server.rtc import ice as rtc_ice
from worldserve.server.settings import Settings

START = {"prompt": "a green forest", "fps": 24.0, "bucket": 64}


def test_no_ice_servers_by_default_and_configured_ones_pass_through() -> None:
    assert rtc_ice.rtc_configuration(RtcSettings()).iceServers == []
    s = RtcSettings(ice_servers=(IceServer(("turn:turn.example:3478",), "u", "p"),))
    (server,) = rtc_ice.rtc_configuration(s).iceServers
    assert (server.urls, server.username, server.credential) == (["turn:turn.example:3478"], "u", "p")


def test_rtc_settings_come_from_worldserve_rtc_variables() -> None:
    env = {
        "WORLDSERVE_RTC_ICE_SERVERS": json.dumps([{"urls": "stun:stun.example:3478"}]),
        "WORLDSERVE_RTC_LOOPBACK_CANDIDATES": "always",
        "WORLDSERVE_RTC_CODECS": "vp8,h264",
        "WORLDSERVE_RTC_ENABLED": "0",
    }
    s = build(Settings, argparse.Namespace(), env).rtc
    assert s.ice_servers == (IceServer(("stun:stun.example:3478",)),)
    assert (s.loopback_candidates, s.codecs, s.enabled) == ("always", ("VP8", "H264"), False)
    assert build(Settings, argparse.Namespace(), {}).rtc == RtcSettings()


@pytest.mark.parametrize(
    "kw",
    [{"loopback_candidates": "sometimes"}, {"codecs": ("AV1",)}, {"codecs": ()},
     {"bits_per_pixel": 0.0}, {"min_bitrate": 10, "max_bitrate": 5}, {"connect_timeout_s": 0.0}],
)
def test_bad_settings_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="bad setting"):
        RtcSettings(**kw)


def test_bad_ice_server_urls_are_refused() -> None:
    with pytest.raises(ValueError, match="stun:/turn:"):
        IceServer(("http://example",))


class _Adapter:
    def __init__(self, ips: list[Any]) -> None:
        self.ips = ips


def test_auto_adds_loopback_only_where_there_is_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    lo = _Adapter([ifaddr.IP("127.0.0.1", 8, "lo"), ifaddr.IP(("::1", 0, 0), 128, "lo")])
    eth = _Adapter([ifaddr.IP("192.0.2.2", 24, "eth0")])
    monkeypatch.setattr(ifaddr, "get_adapters", lambda: [lo])
    assert rtc_ice.only_loopback() and rtc_ice.wants_loopback("auto")
    monkeypatch.setattr(ifaddr, "get_adapters", lambda: [lo, eth])
    assert not rtc_ice.only_loopback() and not rtc_ice.wants_loopback("auto")
    assert rtc_ice.wants_loopback("always") and not rtc_ice.wants_loopback("never")


async def test_a_loopback_only_box_connects_with_the_workaround(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a box whose only interface is loopback: aioice finds no host address."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: [])
    async with serve_rtc(rtc=RtcSettings(loopback_candidates="always")) as (_, url):
        async with RtcClient(url, loopback="always") as c:
            answer = await c.connect(start=START)
            candidates = [ln for ln in answer["sdp"].splitlines() if ln.startswith("a=candidate")]
            assert candidates and all(" 127.0.0.1 " in ln for ln in candidates)
            _, frame = await c.next_frame()
            assert frame.width == 64
            await c.close()


async def test_without_the_workaround_a_loopback_only_box_offers_no_candidate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: [])
    async with serve_rtc(rtc=RtcSettings(loopback_candidates="never", connect_timeout_s=0.5)) as (_, url):
        c = RtcClient(url, loopback="always")
        answer = await c.connect(start=START, wait_open=False)
        assert "a=candidate" not in answer["sdp"]
        await c.close(send_close=False)
