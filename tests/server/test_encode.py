"""Frame encoders: what they produce decodes back to the frame."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
from PIL import Image

from worldserve.bench.encode_cost import ws_ms
from worldserve.server.encode import make_encoder


def frame(side: int, shift: int = 0) -> np.ndarray:
    y, x = np.mgrid[0:side, 0:side]
    img = np.stack([(x * 4 + shift) % 256, (y * 4) % 256, ((x + y) * 2) % 256], -1)
    return img.astype(np.uint8)


def test_raw_is_the_rgb_bytes() -> None:
    data, key = make_encoder("raw").encode(frame(64), 0)
    assert key and data == frame(64).tobytes()


def test_jpeg_decodes_close_to_the_frame() -> None:
    data, key = make_encoder("jpeg", quality=90).encode(frame(64), 0)
    out = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)
    assert key and np.abs(out - frame(64)).mean() < 6


def test_h264_starts_with_a_keyframe_and_gives_one_on_request_and_on_a_size_change() -> None:
    enc = make_encoder("h264", fps=24.0)
    dec = av.CodecContext.create("h264", "r")
    keys = []
    for i in range(6):
        side = 128 if i == 5 else 64
        data, key = enc.encode(frame(side, i), i, key=(i == 3))
        keys.append(key)
        decoded = dec.decode(av.Packet(data))  # one access unit per frame: no parser needed
        assert decoded and decoded[-1].to_ndarray(format="rgb24").shape == (side, side, 3)
    assert keys == [True, False, False, True, False, True]


@pytest.mark.parametrize("codec", ["jpeg", "raw", "h264"])
def test_the_encode_cost_bench_runs_every_codec(codec: str) -> None:
    assert ws_ms(codec, 64, frames=10) > 0  # type: ignore[arg-type]  # the figures: bench.latency
