"""The latency encoders: decodable RTP payloads, keyframes when asked, a sane bitrate."""

from __future__ import annotations

import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection
from aiortc.codecs import get_decoder
from aiortc.codecs.h264 import h264_depayload
from aiortc.codecs.vpx import vp8_depayload
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from worldserve.bench.encode_cost import rtc_ms, sample_frames
from worldserve.server.rtc.encoder import (
    BitratePolicy,
    LatencyEncoder,
    codec_preferences,
    install_encoder,
)
from worldserve.server.rtc.track import SessionVideoTrack
from worldserve.server.settings import VideoCodecName

CODECS: tuple[VideoCodecName, ...] = ("H264", "VP8")


def decode_all(codec: VideoCodecName, encoded: list[tuple[list[bytes], int]]) -> list[np.ndarray]:
    params = RTCRtpCodecParameters(mimeType=f"video/{codec}", clockRate=90000, payloadType=96)
    dec = get_decoder(params)
    depay = h264_depayload if codec == "H264" else vp8_depayload
    out = []
    for payloads, ts in encoded:
        data = b"".join(depay(p) for p in payloads)
        for f in dec.decode(JitterFrame(data=data, timestamp=ts)):
            out.append(f.to_ndarray(format="rgb24"))
    return out


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("bucket", [64, 128])
def test_payloads_decode_back_to_the_frames(codec: VideoCodecName, bucket: int) -> None:
    frames = sample_frames(bucket, 12)
    enc = LatencyEncoder(codec, fps=24.0)
    encoded = [enc.encode(f) for f in frames]
    assert [ts for _, ts in encoded] == [i * 3750 for i in range(12)]
    decoded = decode_all(codec, encoded)
    assert len(decoded) == 12
    for src, got in zip(frames, decoded, strict=True):
        ref = src.to_ndarray(format="rgb24").astype(np.int16)
        assert got.shape == (bucket, bucket, 3)
        assert np.abs(ref - got).mean() < 25  # lossy, but the picture
    assert enc.keyframes == 1 and enc.frames == 12 and enc.bytes > 0


@pytest.mark.parametrize("codec", CODECS)
def test_keyframes_on_request_on_a_size_change_and_on_the_interval(codec: VideoCodecName) -> None:
    enc = LatencyEncoder(codec, fps=10.0, keyframe_interval_s=1.0)  # every 10 frames
    frames = sample_frames(64, 30)
    for f in frames[:5]:
        enc.encode(f)
    assert enc.keyframes == 1
    enc.request_keyframe()
    enc.encode(frames[5])
    assert enc.keyframes == 2
    enc.encode(frames[6], force_keyframe=True)  # aiortc's sender on a PLI
    assert enc.keyframes == 3
    for f in frames[7:17]:
        enc.encode(f)
    assert enc.keyframes == 4  # 10 frames after the last one
    enc.encode(sample_frames(128, 1)[0])  # a bucket switch
    assert enc.keyframes == 5


def test_bitrate_follows_the_frame_size_and_feedback_stays_in_bounds() -> None:
    policy = BitratePolicy(bits_per_pixel=1.0, lo=64_000, hi=4_000_000)
    assert policy.target(64, 64, 24) == 98_304
    assert policy.target(128, 128, 24) == 393_216
    assert policy.target(16, 16, 1) == 64_000  # clamped
    enc = LatencyEncoder("H264", fps=24.0, policy=policy)
    enc.encode(sample_frames(64, 1)[0])
    assert enc.target_bitrate == 98_304
    enc.target_bitrate = 10_000_000  # REMB says the link is fat: at most 3x the target
    assert enc.target_bitrate == 3 * 98_304
    enc.target_bitrate = 1  # and at least a quarter
    assert enc.target_bitrate == 64_000


def test_h264_is_preferred_then_vp8_with_rtx() -> None:
    prefs = codec_preferences(("H264", "VP8"))
    names = [c.mimeType for c in prefs]
    first_vp8 = names.index("video/VP8")
    assert set(names[:first_vp8]) == {"video/H264"} and names[-1] == "video/rtx"
    assert [c.mimeType for c in codec_preferences(("VP8",))] == ["video/VP8", "video/rtx"]


async def test_the_sender_uses_our_encoder() -> None:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    track = SessionVideoTrack(24.0)
    transceiver = pc.addTransceiver(track, direction="sendonly")
    enc = LatencyEncoder("H264")
    assert install_encoder(transceiver.sender, enc)
    assert transceiver.sender._RTCRtpSender__encoder is enc  # type: ignore[attr-defined]
    await pc.close()


def test_the_encode_cost_bench_reports_milliseconds_per_frame() -> None:
    assert rtc_ms("H264", 64, frames=10, repeats=1) > 0  # the figures: bench.latency
