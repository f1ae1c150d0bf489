"""Frame encoders for the WebSocket transport: JPEG (Pillow), raw RGB, H.264 (PyAV).

One encoder per session and connection. H.264 is libx264 with ``ultrafast`` +
``zerolatency`` (no B-frames, no lookahead: each frame comes out at once), one thread, a
keyframe on request and whenever the frame size changes (a bucket switch). Output is
Annex B, one access unit per frame. ``measure`` times each codec per frame for the bench.

Encoders with ``offload`` set do codec work that belongs off the event loop: the WebSocket
writer runs their ``encode`` on the app's codec pool (server/offload.py), one call at a time
per encoder (H.264 keeps state from frame to frame). ``close`` may come from the loop while
an encode runs on a pool thread: that encode finishes on the context it started with.
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import ClassVar, Protocol

import av
import numpy as np
from av.video.frame import PictureType
from PIL import Image

from worldserve.protocol import Codec


class FrameEncoder(Protocol):
    codec: Codec
    offload: ClassVar[bool]  # encode off the event loop (codec work, not a copy)

    def encode(self, frame: np.ndarray, index: int, *, key: bool = False) -> tuple[bytes, bool]:
        """(H, W, 3) uint8 -> (bytes, is_keyframe). ``index`` is the frame's number."""
        ...

    def close(self) -> None: ...


class RawEncoder:
    codec: Codec = "raw"
    offload: ClassVar[bool] = False  # one copy of the frame: cheaper than a thread hop

    def encode(self, frame: np.ndarray, index: int, *, key: bool = False) -> tuple[bytes, bool]:
        return np.ascontiguousarray(frame, dtype=np.uint8).tobytes(), True

    def close(self) -> None:
        pass


class JpegEncoder:
    codec: Codec = "jpeg"
    offload: ClassVar[bool] = True

    def __init__(self, quality: int = 80) -> None:
        if not 1 <= quality <= 95:
            raise ValueError(f"jpeg quality must be in [1, 95], got {quality!r}")
        self.quality = quality

    def encode(self, frame: np.ndarray, index: int, *, key: bool = False) -> tuple[bytes, bool]:
        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(frame)).save(buf, "JPEG", quality=self.quality)
        return buf.getvalue(), True

    def close(self) -> None:
        pass


class H264Encoder:
    codec: Codec = "h264"
    offload: ClassVar[bool] = True

    def __init__(self, fps: float = 24.0) -> None:
        self.fps = fps
        self._ctx: object | None = None
        self._size: tuple[int, int] | None = None

    def _open(self, width: int, height: int) -> object:
        ctx = av.CodecContext.create("libx264", "w")
        ctx.width, ctx.height = width, height
        ctx.pix_fmt = "yuv420p"
        rate = Fraction(self.fps).limit_denominator(1001)
        ctx.framerate = rate
        ctx.time_base = 1 / rate
        ctx.thread_count = 1
        ctx.options = {"preset": "ultrafast", "tune": "zerolatency"}
        self._size = (width, height)
        return ctx

    def encode(self, frame: np.ndarray, index: int, *, key: bool = False) -> tuple[bytes, bool]:
        h, w = frame.shape[:2]
        ctx = self._ctx
        if ctx is None or self._size != (w, h):  # first frame or a bucket switch
            ctx = self._ctx = self._open(w, h)
        vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
        vf = vf.reformat(format="yuv420p")
        vf.pts = index
        if key:
            vf.pict_type = PictureType.I
        packets = ctx.encode(vf)  # type: ignore[attr-defined]
        return b"".join(bytes(p) for p in packets), any(p.is_keyframe for p in packets)

    def close(self) -> None:
        self._ctx = None  # PyAV frees the codec context when it is collected


def make_encoder(codec: Codec, *, quality: int = 80, fps: float = 24.0) -> FrameEncoder:
    if codec == "jpeg":
        return JpegEncoder(quality)
    if codec == "raw":
        return RawEncoder()
    if codec == "h264":
        return H264Encoder(fps)
    raise ValueError(f"unknown codec {codec!r}")

