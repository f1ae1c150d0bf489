"""Video encoders for the WebRTC sender, tuned for latency, and the codec choice.

aiortc's own encoders are built for camera video: its H.264 is libx264 at the default
preset (medium; 2-10x slower than ultrafast at our sizes) with at least 500 kbps, and its
VP8 picks threads by frame size. ``LatencyEncoder`` implements aiortc's ``Encoder``
interface with the settings a generated stream wants: libx264 ``ultrafast`` +
``zerolatency`` (no B-frames, no lookahead, constrained baseline, one thread) or libvpx
VP8 realtime with one thread; a bitrate from the frame size and rate (``BitratePolicy``);
a keyframe on request (PLI/FIR from the receiver, a new session, a ``keyframe`` message),
on a size change (a bucket switch) and every ``keyframe_interval_s``. RTP packetization
is aiortc's.

Measured here (``measure``: 240 frames, median of 7 runs, four rounds; a 2-core box shared
with a training job, so ranges), milliseconds per frame:

    bucket   x264 ultrafast+zerolatency   VP8 realtime, 1 thread   x264 as aiortc sets it
    64       0.07-0.15                    0.18-0.43                0.40-0.78
    128      0.16-0.27                    0.45-0.80                1.1-1.95

So H.264 is offered first, VP8 second (a browser without H.264 still gets video).

aiortc has no public hook for a sender's encoder: ``install_encoder`` sets the sender's
private slot before its RTP loop starts (aiortc 1.16; tests/rtc/test_encoder.py checks it). If that slot is missing
(another aiortc), the sender keeps aiortc's encoder and the stream still works, slower.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import av
from aiortc import RTCRtpSender
from aiortc.codecs.base import Encoder
from aiortc.codecs.h264 import H264Encoder as _AiortcH264
from aiortc.codecs.vpx import Vp8Encoder as _AiortcVp8
from aiortc.mediastreams import VIDEO_TIME_BASE, convert_timebase
from aiortc.rtcrtpparameters import RTCRtpCodecCapability
from av.video.frame import PictureType

from worldserve.server.settings import RtcSettings, VideoCodecName

log = logging.getLogger("worldserve.rtc")

_SENDER_ENCODER_SLOT = "_RTCRtpSender__encoder"  # aiortc 1.16: RTCRtpSender.__encoder


@dataclass(frozen=True, slots=True)
class BitratePolicy:
    """Bits per second for a frame size and rate: ``bits_per_pixel`` per pixel per frame,
    clamped to [lo, hi]; receiver feedback (REMB) may move it within [target/4, target*3]."""

    bits_per_pixel: float = 1.0
    lo: int = 64_000
    hi: int = 4_000_000

    def target(self, width: int, height: int, fps: float) -> int:
        return self._clamp(self.bits_per_pixel * width * height * fps)

    def bounds(self, width: int, height: int, fps: float) -> tuple[int, int]:
        t = self.target(width, height, fps)
        return self._clamp(t / 4), self._clamp(t * 3)

    def _clamp(self, bps: float) -> int:
        return int(min(self.hi, max(self.lo, bps)))

    @classmethod
    def from_settings(cls, s: RtcSettings) -> BitratePolicy:
        return cls(s.bits_per_pixel, s.min_bitrate, s.max_bitrate)


class LatencyEncoder(Encoder):
    """One video stream's encoder (aiortc's ``Encoder`` interface): ``encode`` runs on
    aiortc's executor thread, the rest on the event loop."""

    def __init__(
        self,
        codec: VideoCodecName,
        *,
        fps: float = 24.0,
        policy: BitratePolicy | None = None,
        keyframe_interval_s: float = 10.0,
    ) -> None:
        if codec not in ("H264", "VP8"):
            raise ValueError(f"codec must be H264 or VP8, got {codec!r}")
        self.codec: VideoCodecName = codec
        self.fps = fps
        self.policy = policy or BitratePolicy()
        self.keyframe_every = max(1, round(keyframe_interval_s * fps))
        self._ctx: Any = None  # av's VideoCodecContext; opened on the first frame
        self._size: tuple[int, int] | None = None
        self._bitrate = 0  # the rate the context was opened with
        self._target: int | None = None  # None: the policy's target for the size
        self._key_wanted = True
        self._since_key = 0
        self._picture_id = 0  # VP8 payload descriptor picture id
        # Counters (read by the peer for stats and metrics).
        self.frames = 0
        self.keyframes = 0
        self.bytes = 0
        self.seconds = 0.0

    # --- aiortc's Encoder interface ---

    def encode(self, frame: Any, force_keyframe: bool = False) -> tuple[list[bytes], int]:
        t0 = time.perf_counter()
        if frame.format.name != "yuv420p":
            frame = frame.reformat(format="yuv420p")
        size = (frame.width, frame.height)
        if self._ctx is None or self._size != size or self._drifted(size):
            self._open(size)
        self._since_key += 1
        key = force_keyframe or self._key_wanted or self._since_key >= self.keyframe_every
        frame.pict_type = PictureType.I if key else PictureType.NONE
        packets = self._ctx.encode(frame)
        data = b"".join(bytes(p) for p in packets)
        if key:
            self._key_wanted = False
        if any(p.is_keyframe for p in packets):
            self._since_key = 0
            self.keyframes += 1
        payloads = self._packetize(data)
        self.frames += 1
        self.bytes += len(data)
        self.seconds += time.perf_counter() - t0
        return payloads, convert_timebase(frame.pts, frame.time_base, VIDEO_TIME_BASE)

    def pack(self, packet: Any) -> tuple[list[bytes], int]:
        payloads = self._packetize(bytes(packet))
        return payloads, convert_timebase(packet.pts, packet.time_base, VIDEO_TIME_BASE)

    @property
    def target_bitrate(self) -> int:
        """Bits per second now (aiortc sets it from REMB feedback; kept within the policy's
        bounds for the current frame size)."""
        if self._size is None:
            return self._target or self.policy.target(64, 64, self.fps)
        return self._target or self.policy.target(*self._size, self.fps)

    @target_bitrate.setter
    def target_bitrate(self, bps: int) -> None:
        w, h = self._size or (64, 64)
        lo, hi = self.policy.bounds(w, h, self.fps)
        self._target = int(min(hi, max(lo, bps)))

    # --- ours ---

    def request_keyframe(self) -> None:
        """The next frame is a keyframe (safe to call from the event loop)."""
        self._key_wanted = True

    def close(self) -> None:
        self._ctx = None  # PyAV frees the codec context when it is collected

    @property
    def ms_per_frame(self) -> float:
        return self.seconds * 1000 / self.frames if self.frames else float("nan")

    def _drifted(self, size: tuple[int, int]) -> bool:
        """Reopen when the target moved by more than 10% (as aiortc's encoders do)."""
        return self._target is not None and abs(self._target - self._bitrate) > 0.1 * self._bitrate

    def _open(self, size: tuple[int, int]) -> None:
        if self._size != size:
            self._target = None  # feedback was for the old size
        self._size = size
        bitrate = self.target_bitrate
        rate = Fraction(self.fps).limit_denominator(1001)
        if self.codec == "H264":
            ctx = av.CodecContext.create("libx264", "w")
            ctx.profile = "Baseline"  # ultrafast has no CABAC/B-frames: constrained baseline
            ctx.options = {
                "preset": "ultrafast",
                "tune": "zerolatency",
                "level": "31",
                "maxrate": str(bitrate),
                "bufsize": str(bitrate),  # one second of VBV buffer
            }
        else:
            ctx = av.CodecContext.create("libvpx", "w")
            ctx.qmin, ctx.qmax = 2, 56
            ctx.options = {  # aiortc's realtime VP8 options, with our rate
                "bufsize": str(bitrate),
                "cpu-used": "-6",
                "deadline": "realtime",
                "lag-in-frames": "0",
                "minrate": str(bitrate),
                "maxrate": str(bitrate),
                "noise-sensitivity": "4",
                "overshoot-pct": "15",
                "partitions": "0",
                "static-thresh": "1",
                "undershoot-pct": "100",
            }
        ctx.width, ctx.height = size
        ctx.pix_fmt = "yuv420p"
        ctx.bit_rate = bitrate
        ctx.framerate = rate
        ctx.time_base = 1 / rate
        ctx.gop_size = self.keyframe_every
        ctx.thread_count = 1
        self._ctx = ctx
        self._bitrate = bitrate
        self._key_wanted = True

    def _packetize(self, data: bytes) -> list[bytes]:
        if not data:
            return []
        if self.codec == "H264":
            return _AiortcH264._packetize(_AiortcH264._split_bitstream(data))
        payloads = _AiortcVp8._packetize(data, self._picture_id)
        self._picture_id = (self._picture_id + 1) % (1 << 15)
        return payloads


def install_encoder(sender: RTCRtpSender, encoder: Encoder) -> bool:
    """Make ``sender`` use ``encoder`` (call before its RTP loop starts, i.e. before the
    answer is set). False, with a warning, if this aiortc has no such slot."""
    if not hasattr(sender, _SENDER_ENCODER_SLOT):
        log.warning("this aiortc has no sender encoder slot; using its default encoder")
        return False
    setattr(sender, _SENDER_ENCODER_SLOT, encoder)
    return True


def codec_preferences(codecs: tuple[VideoCodecName, ...]) -> list[RTCRtpCodecCapability]:
    """aiortc's video capabilities for ``codecs``, in that order, each with its RTX entry
    (``setCodecPreferences`` wants objects from ``getCapabilities``)."""
    caps = RTCRtpSender.getCapabilities("video").codecs
    out = [c for name in codecs for c in caps if c.mimeType.lower() == f"video/{name.lower()}"]
    out += [c for c in caps if c.mimeType.lower() == "video/rtx"]
    return out


def codec_name(mime_type: str) -> VideoCodecName | None:
    name = mime_type.split("/")[-1].upper()
    return name if name in ("H264", "VP8") else None  # type: ignore[return-value]

