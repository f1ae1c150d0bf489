"""Message types, their wire form and their validation."""

from __future__ import annotations

import io

import msgpack
import numpy as np
import pytest
from PIL import Image as PILImage

from worldserve.protocol import (
    CLIENT_TYPES,
    PROTOCOL_VERSION,
    SERVER_TYPES,
    Ack,
    Action,
    Block,
    Close,
    Degradation,
    Ended,
    Error,
    Frame,
    Image,
    Keyframe,
    Migrate,
    Observation,
    Ping,
    Pong,
    Prompt,
    ProtocolError,
    Resume,
    Resumed,
    Save,
    Saved,
    Skipped,
    Start,
    Started,
    Status,
    decode_client,
    decode_server,
    error_from,
)
from worldserve.session.errors import AtCapacity, StaleBlock

RGB = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)

CLIENT_EXAMPLES = [
    Start("a snowy forest", 3, 12.0, 64, "h264", "pull", 0, 70, Image.from_array(RGB, "raw"), 50.0, "k"),
    Action(7, ("forward", "left"), (0.25, -1.0)),
    Prompt("a desert at dusk", 2),
    Observation(Image.from_array(RGB, "png"), 4),
    Block(9, 120.0),
    Resume("abc_DEF-1", "tok", 12),
    Keyframe(),
    Close("bye"),
    Ping(5),
    Save("my forest"),
]
SERVER_EXAMPLES = [
    Started("s1", "tok", 1, "push", "jpeg", 24.0, 64, 64, 64, 1, 0, 4, 1, 0, (64, 128)),
    Resumed("s1", 12, 0, -1, 3, "push", "raw", 24.0, 64, 64, 1, 0),
    Resumed("s1", 12, 0, -1, 0, "push", "raw", 24.0, 64, 64, 1, 0, restored_from=9, gap_blocks=3),
    Frame("s1", 3, 3, 125000, 2, "raw", 6, 4, RGB.tobytes(), True, 1.5, 1.6),
    Status(1, 23.5, 24.0, 0, 2, 1, 0, 64, 3, 0, 0.7),
    Degradation(0, 1, ("lookahead 1->0",), 24.0, 64, 4, 0),
    Skipped(5, 4, 1),
    Ack("prompt", 2),
    Error("bad_message", "seq: must be an integer", "seq"),
    Ended("s1", "client_close"),
    Pong(5, 1.0),
    Migrate("s1", "ws://10.0.0.8:8000/v1/ws", 12, "w2"),
    Saved("w0rld-id-1234", "my forest", 48, 12),
]


def test_every_message_type_has_an_example() -> None:
    assert {type(m) for m in CLIENT_EXAMPLES} == set(CLIENT_TYPES.values())
    assert {type(m) for m in SERVER_EXAMPLES} == set(SERVER_TYPES.values())


@pytest.mark.parametrize("msg", CLIENT_EXAMPLES, ids=lambda m: m.TYPE)
def test_client_messages_round_trip_through_msgpack(msg: object) -> None:
    data = msg.encode()  # type: ignore[attr-defined]
    wire = msgpack.unpackb(data)
    assert wire["v"] == PROTOCOL_VERSION and wire["type"] == msg.TYPE  # type: ignore[attr-defined]
    assert decode_client(data) == msg


@pytest.mark.parametrize("msg", SERVER_EXAMPLES, ids=lambda m: m.TYPE)
def test_server_messages_round_trip_through_msgpack(msg: object) -> None:
    assert decode_server(msg.encode()) == msg  # type: ignore[attr-defined]


def test_defaults_fill_missing_optional_fields() -> None:
    msg = decode_client(msgpack.packb({"type": "start", "v": 1}))
    assert msg == Start()
    assert decode_client(msgpack.packb({"type": "action", "v": 1, "seq": 1})) == Action(1)


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    assert decode_client(msgpack.packb({"type": "ping", "v": 1, "id": 1, "new": [1]})) == Ping(1)


@pytest.mark.parametrize(
    ("wire", "field", "code"),
    [
        ({"type": "action", "v": 1}, "seq", "bad_message"),
        ({"type": "action", "v": 1, "seq": 0}, "seq", "bad_message"),
        ({"type": "action", "v": 1, "seq": True}, "seq", "bad_message"),
        ({"type": "action", "v": 1, "seq": 1, "keys": ["fly"]}, "keys", "bad_message"),
        ({"type": "action", "v": 1, "seq": 1, "mouse": [1.0]}, "mouse", "bad_message"),
        ({"type": "action", "v": 1, "seq": 1, "mouse": [float("nan"), 0]}, "mouse[0]", "bad_message"),
        ({"type": "start", "v": 1, "fps": 0}, "fps", "bad_message"),
        ({"type": "start", "v": 1, "fps": 1000}, "fps", "bad_message"),
        ({"type": "start", "v": 1, "codec": "vp9"}, "codec", "bad_message"),
        ({"type": "start", "v": 1, "mode": "both"}, "mode", "bad_message"),
        ({"type": "start", "v": 1, "prompt": "x" * 5000}, "prompt", "bad_message"),
        ({"type": "start", "v": 1, "observation": {"format": "raw", "data": b"x"}}, "observation.shape", "bad_message"),
        ({"type": "block", "v": 1, "block_idx": -1}, "block_idx", "bad_message"),
        ({"type": "resume", "v": 1, "session_id": "a b", "token": "t", "block_idx": 1}, "session_id", "bad_message"),
        ({"type": "ping", "v": 2}, "v", "unsupported_version"),
        ({"type": "ping"}, "v", "bad_message"),  # no version at all: not a v1 message
        ({}, "v", "bad_message"),
        ({"type": "nope", "v": 1}, "type", "bad_message"),
    ],
)
def test_validation_names_the_field_and_the_reason(wire: dict[str, object], field: str, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_client(msgpack.packb(wire, use_bin_type=True))
    assert info.value.field == field and info.value.code == code and info.value.reason


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x93\x01\x02", msgpack.packb([1]), msgpack.packb("x")])
def test_undecodable_bytes_are_bad_messages(data: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_client(data)
    assert info.value.code == "bad_message"


def test_every_truncation_of_a_valid_message_is_a_protocol_error() -> None:
    data = CLIENT_EXAMPLES[0].encode()
    for n in range(len(data)):
        with pytest.raises(ProtocolError):
            decode_client(data[:n])


def test_building_a_bad_message_in_python_fails_the_same_way() -> None:
    with pytest.raises(ProtocolError) as info:
        Action(1, ("jump",))
    assert info.value.field == "keys"


@pytest.mark.parametrize("fmt", ["raw", "png", "jpeg"])
def test_images_decode_to_rgb_arrays(fmt: str) -> None:
    img = Image.from_array(np.repeat(RGB, 4, axis=0), fmt, quality=95)  # type: ignore[arg-type]
    out = img.decode()
    assert out.shape == (16, 6, 3) and out.dtype == np.uint8
    assert out.flags.writeable  # a model may hand it to torch as it is (a read-only one warns)
    if fmt != "jpeg":
        assert np.array_equal(out, np.repeat(RGB, 4, axis=0))


def test_an_image_that_is_not_what_it_claims_is_refused() -> None:
    buf = io.BytesIO()
    PILImage.fromarray(RGB).save(buf, "PNG")
    with pytest.raises(ProtocolError) as info:
        Image("jpeg", buf.getvalue()).decode()
    assert info.value.field == "data"
    with pytest.raises(ProtocolError):
        Image("png", b"\x89PNG\r\n\x1a\nnot really").decode()
    with pytest.raises(ProtocolError):
        Image("png", buf.getvalue()).decode(max_pixels=10)


def test_errors_carry_session_layer_codes() -> None:
    assert error_from(StaleBlock("s", 5, 2)).code == "stale_block"
    err = error_from(AtCapacity(4, 2.5), fatal=True, retry_after=2.5)
    assert (err.code, err.fatal, err.retry_after) == ("at_capacity", True, 2.5)
    assert error_from(ProtocolError("why", "f")).field == "f"
