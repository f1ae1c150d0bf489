"""What encoding a frame costs, per codec and bucket, on the WebSocket and WebRTC paths.

Frames are smooth, moving and blocky (a world frame's statistics, roughly): a random
quarter-size image scaled up 4x and panned by a few pixels a frame. ``bench.latency``
prints these figures beside the action-to-frame latency; alone:

    python -m bench.encode_cost --buckets 64 128
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import av
import numpy as np
from aiortc.codecs.base import Encoder
from aiortc.codecs.h264 import H264Encoder as AiortcH264
from aiortc.codecs.vpx import Vp8Encoder as AiortcVp8
from aiortc.mediastreams import VIDEO_TIME_BASE

from worldserve.protocol import Codec
from worldserve.server.encode import make_encoder
from worldserve.server.rtc.encoder import LatencyEncoder
from worldserve.server.settings import VideoCodecName


def moving_frames(bucket: int, n: int, seed: int = 0) -> list[np.ndarray]:
    """``n`` (bucket, bucket, 3) uint8 frames panning over one blocky image."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (bucket // 4 + 2, bucket // 4 + 2, 3), dtype=np.uint8)
    big = np.kron(base, np.ones((4, 4, 1), np.uint8))
    return [np.ascontiguousarray(big[i % 8 : i % 8 + bucket, i % 8 : i % 8 + bucket]) for i in range(n)]


def sample_frames(bucket: int, n: int, seed: int = 0) -> list[av.VideoFrame]:
    """The same frames as yuv420p ``av.VideoFrame``s on the 90 kHz video clock (24 fps)."""
    out = []
    for i, arr in enumerate(moving_frames(bucket, n, seed)):
        vf = av.VideoFrame.from_ndarray(arr, format="rgb24").reformat(format="yuv420p")
        vf.pts, vf.time_base = i * 3750, VIDEO_TIME_BASE
        out.append(vf)
    return out


def ws_ms(codec: Codec, bucket: int, frames: int = 60, seed: int = 0) -> float:
    """Milliseconds per frame of the WebSocket encoder (after the first frame opens it)."""
    vfs = moving_frames(bucket, frames + 1, seed)
    enc = make_encoder(codec)
    enc.encode(vfs[0], 0)
    t0 = time.perf_counter()
    for i, frame in enumerate(vfs[1:], 1):
        enc.encode(frame, i)
    enc.close()
    return (time.perf_counter() - t0) * 1000 / frames


def rtc_ms(codec: VideoCodecName, bucket: int, frames: int = 120, repeats: int = 5, fps: float = 24.0) -> float:
    """Median over ``repeats`` runs of the WebRTC encoder's milliseconds per frame (after a
    keyframe)."""
    return _median_ms(lambda: LatencyEncoder(codec, fps=fps), bucket, frames, repeats)


def aiortc_default_ms(codec: VideoCodecName, bucket: int, frames: int = 120, repeats: int = 5) -> float:
    """The same for aiortc's own encoder (for comparison)."""
    make: Callable[[], Encoder] = AiortcH264 if codec == "H264" else AiortcVp8
    return _median_ms(make, bucket, frames, repeats)


def _median_ms(make: Callable[[], Encoder], bucket: int, frames: int, repeats: int) -> float:
    vfs = sample_frames(bucket, frames + 1)
    runs = []
    for _ in range(repeats):
        enc = make()
        enc.encode(vfs[0], True)
        t0 = time.perf_counter()
        for vf in vfs[1:]:
            enc.encode(vf)
        runs.append((time.perf_counter() - t0) * 1000 / frames)
    return statistics.median(runs)


def table(buckets: tuple[int, ...], frames: int = 60) -> list[str]:
    """One line per codec and bucket: the WebSocket's codecs, then WebRTC's."""
    lines = []
    for codec in ("jpeg", "raw", "h264"):
        for bucket in buckets:
            ms = ws_ms(codec, bucket, frames=frames)  # type: ignore[arg-type]
            lines.append(f"encode codec={codec} bucket={bucket} ms_per_frame={ms:.3f}")
    for rtc_codec in ("H264", "VP8"):
        for bucket in buckets:
            ms = rtc_ms(rtc_codec, bucket, frames=frames)  # type: ignore[arg-type]
            lines.append(f"encode codec=rtc-{rtc_codec.lower()} bucket={bucket} ms_per_frame={ms:.3f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--buckets", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--frames", type=int, default=60)
    args = ap.parse_args(argv)
    for line in table(tuple(args.buckets), args.frames):
        print(line)


if __name__ == "__main__":
    main()
