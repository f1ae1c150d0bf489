"""WebRTC metrics, on the app's registry (server/metrics.py owns it), in base units."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_ENCODE = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05)
_CONNECT = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 15.0)


class RtcMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.peers = Gauge("worldserve_webrtc_peers", "Open WebRTC peer connections", registry=r)
        self.offers = Counter(
            "worldserve_webrtc_offers", "SDP offers, by result (ok or an error code)", ["result"],
            registry=r,
        )
        self.connects = Counter(
            "worldserve_webrtc_connects", "Peer connections by outcome: ok, failed, timeout",
            ["result"], registry=r,
        )
        self.connect_seconds = Histogram(
            "worldserve_webrtc_connect_seconds", "From the offer to the peer being connected",
            buckets=_CONNECT, registry=r,
        )
        self.frames_sent = Counter(
            "worldserve_webrtc_frames_sent", "Video frames handed to the encoder", ["codec"],
            registry=r,
        )
        self.bytes_sent = Counter(
            "worldserve_webrtc_video_bytes", "Encoded video bytes", ["codec"], registry=r
        )
        self.encode_seconds = Histogram(
            "worldserve_webrtc_encode_seconds",
            "Encoding one frame (mean over a status interval, per peer)", ["codec"],
            buckets=_ENCODE, registry=r,
        )
