"""WebRTC settings: one frozen dataclass, validated, with a comment per field.

They live beside the transport (server/settings.py holds the server-wide ones) and are
handed to ``setup_rtc``; ``from_env`` reads them from ``WORLDSERVE_RTC_*`` variables so a
deployment can set STUN/TURN servers without code.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

VideoCodecName = Literal["H264", "VP8"]
Loopback = Literal["auto", "always", "never"]


@dataclass(frozen=True, slots=True)
class IceServer:
    """A STUN or TURN server (``urls`` like ``stun:host:3478`` or ``turn:host:3478``)."""

    urls: tuple[str, ...]
    username: str | None = None
    credential: str | None = None

    def __post_init__(self) -> None:
        if not self.urls or not all(
            isinstance(u, str) and u.split(":", 1)[0] in ("stun", "stuns", "turn", "turns")
            for u in self.urls
        ):
            raise ValueError(f"bad setting: ice server urls {self.urls!r} must be stun:/turn: URLs")


@dataclass(frozen=True, slots=True)
class RtcSettings:
    enabled: bool = True  # False: /v1/rtc/offer answers 404 (the page falls back to WebSocket)
    # No STUN/TURN by default: on loopback and LANs host candidates are enough, and an
    # empty list keeps aiortc from looking up a public STUN server. Set them for real
    # deployments behind NAT.
    ice_servers: tuple[IceServer, ...] = ()
    # aioice never offers 127.0.0.1; on a box whose only interface is loopback nothing
    # connects. "auto" adds 127.0.0.1 to the host candidates only there; "always" adds it
    # on every box; "never" leaves aioice as it is. (The workaround is tied to aioice 0.13,
    # pinned in pyproject.toml.)
    loopback_candidates: Loopback = "auto"
    # Video codecs offered in this order (the first one the client also has is used).
    # H.264 first: x264 ultrafast+zerolatency encodes 3-5x faster than VP8 at 64-128 px
    # (python -m bench.latency prints the table).
    codecs: tuple[VideoCodecName, ...] = ("H264", "VP8")
    # Target video bitrate: bits per pixel per frame, clamped to [min, max] bps. Congestion
    # feedback (REMB) moves it between target/4 and target*3, inside the clamp.
    bits_per_pixel: float = 1.0
    min_bitrate: int = 64_000
    max_bitrate: int = 4_000_000
    keyframe_interval_s: float = 10.0  # a keyframe at least this often (and on PLI)
    connect_timeout_s: float = 15.0  # an offer whose peer does not connect by then is dropped
    max_offer_bytes: int = 64 * 1024  # size limit of the POST body
    control_buffer_bytes: int = 256 * 1024  # control data queued in SCTP before we hold back
    close_flush_s: float = 0.2  # after ``ended``, wait this long for it to leave, then close

    def __post_init__(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ValueError(f"bad setting: {what}")

        need(self.loopback_candidates in ("auto", "always", "never"),
             f"loopback_candidates {self.loopback_candidates!r} is auto, always or never")
        need(len(self.codecs) > 0 and all(c in ("H264", "VP8") for c in self.codecs),
             f"codecs {self.codecs!r} must be a non-empty subset of H264, VP8")
        need(math.isfinite(self.bits_per_pixel) and self.bits_per_pixel > 0,
             f"bits_per_pixel {self.bits_per_pixel!r} must be finite and > 0")
        need(0 < self.min_bitrate <= self.max_bitrate,
             f"need 0 < min_bitrate {self.min_bitrate!r} <= max_bitrate {self.max_bitrate!r}")
        for name in ("keyframe_interval_s", "connect_timeout_s", "close_flush_s"):
            v = getattr(self, name)
            need(math.isfinite(v) and v > 0, f"{name} {v!r} must be finite and > 0")
        need(self.max_offer_bytes >= 4096, f"max_offer_bytes {self.max_offer_bytes!r} must be >= 4096")
        need(self.control_buffer_bytes >= 4096,
             f"control_buffer_bytes {self.control_buffer_bytes!r} must be >= 4096")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RtcSettings:
        """Settings from ``WORLDSERVE_RTC_ENABLED`` (0/1), ``WORLDSERVE_RTC_ICE_SERVERS`` (JSON:
        ``[{"urls": ["stun:..."], "username": .., "credential": ..}]``),
        ``WORLDSERVE_RTC_LOOPBACK`` (auto/always/never) and ``WORLDSERVE_RTC_CODECS``
        (e.g. ``VP8,H264``); the rest keep their defaults."""
        env = os.environ if env is None else env
        kw: dict[str, object] = {}
        if "WORLDSERVE_RTC_ENABLED" in env:
            kw["enabled"] = env["WORLDSERVE_RTC_ENABLED"].strip().lower() not in ("0", "false", "no", "off")
        if env.get("WORLDSERVE_RTC_ICE_SERVERS"):
            raw = json.loads(env["WORLDSERVE_RTC_ICE_SERVERS"])
            if not isinstance(raw, list):
                raise ValueError("bad setting: WORLDSERVE_RTC_ICE_SERVERS must be a JSON list")
            kw["ice_servers"] = tuple(_ice_server(s) for s in raw)
        if env.get("WORLDSERVE_RTC_LOOPBACK"):
            kw["loopback_candidates"] = env["WORLDSERVE_RTC_LOOPBACK"].strip().lower()
        if env.get("WORLDSERVE_RTC_CODECS"):
            kw["codecs"] = tuple(c.strip().upper() for c in env["WORLDSERVE_RTC_CODECS"].split(",") if c.strip())
        return cls(**kw)  # type: ignore[arg-type]


def _ice_server(obj: object) -> IceServer:
    if not isinstance(obj, dict) or "urls" not in obj:
        raise ValueError(f"bad setting: an ice server is a map with urls, got {obj!r}")
    urls = obj["urls"]
    urls = (urls,) if isinstance(urls, str) else tuple(urls)
    return IceServer(urls, obj.get("username"), obj.get("credential"))

