"""Fuzzing: generated, mutated and truncated messages never crash a handler, the server or
another session, and every message that cannot be used gets a clear error."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.harness import Served, recv, send, serve
from worldserve.protocol import (
    CLIENT_TYPES,
    Action,
    Block,
    Close,
    Error,
    Frame,
    Image,
    Keyframe,
    Observation,
    Ping,
    Pong,
    Prompt,
    ProtocolError,
    Resume,
    Start,
    Started,
    decode_client,
)

FIELD_NAMES = sorted(
    {"type", "v", "seq", "keys", "mouse", "prompt", "id", "image", "block_idx", "deadline_ms",
     "session_id", "token", "seed", "fps", "bucket", "codec", "mode", "lookahead", "quality",
     "observation", "api_key", "reason", "format", "data", "shape", "dtype"}
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.binary(max_size=64),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
images = st.fixed_dictionaries(
    {"format": st.sampled_from(["raw", "png", "jpeg", "gif", 3]), "data": st.binary(max_size=200)},
    optional={"shape": st.lists(st.integers(-2, 70), max_size=4), "dtype": st.sampled_from(["uint8", "f4", 1])},
)
type_tags = st.one_of(st.sampled_from([*sorted(CLIENT_TYPES), "frame", "started", ""]), values)
messages = st.builds(
    lambda tag, v, rest: {**rest, "type": tag, "v": v},
    type_tags,
    st.one_of(st.just(1), st.just(1), values),
    st.dictionaries(st.sampled_from(FIELD_NAMES), st.one_of(values, images), max_size=6),
)

_RAW = Image.from_array(np.zeros((8, 8, 3), np.uint8), "raw")
VALID: list[bytes] = [
    m.encode()
    for m in (
        Action(1, ("forward", "left"), (0.5, -1.0)),
        Prompt("a snowy forest at night", 3),
        Observation(_RAW, 4),
        Block(2, 100.0),
        Resume("abc", "token", 3),
        Start("forest", 1, 12.0, 64, "raw", "pull", 0, 50, _RAW, 100.0, "key"),
        Keyframe(),
        Ping(5),
    )
]
truncated = st.sampled_from(VALID).flatmap(
    lambda b: st.integers(0, len(b) - 1).map(lambda n: b[:n])
)
mutated = st.builds(
    lambda b, key, value: {**msgpack.unpackb(b), key: value},
    st.sampled_from(VALID),
    st.sampled_from(FIELD_NAMES),
    st.one_of(values, images),
)


def _pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


wire = st.one_of(
    messages.map(_pack), mutated.map(_pack), truncated, st.binary(max_size=300)
)


@settings(max_examples=400, deadline=None)
@given(wire)
def test_decoding_any_bytes_gives_a_message_or_a_protocol_error_with_a_reason(data: bytes) -> None:
    try:
        msg = decode_client(data)
    except ProtocolError as exc:
        assert exc.code and exc.reason
        return
    assert type(msg) in CLIENT_TYPES.values()
    assert decode_client(msg.encode()) == msg  # what validates round-trips


@dataclass
class Pair:
    served: Served
    fuzzed: aiohttp.ClientWebSocketResponse
    other: aiohttp.ClientWebSocketResponse
    other_frames: list[float]
    fuzzed_frames: list[float]
    reader: asyncio.Task[None]


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    async with serve(max_msgs_per_s=1e6, msg_burst=100_000, capacity=4) as s:
        fuzzed = await s.connect()
        other = await s.connect()
        for ws in (fuzzed, other):
            await send(ws, Start("forest", fps=25.0, codec="raw"))
            assert isinstance(await recv(ws), Started)
        other_frames: list[float] = []

        async def read_other() -> None:
            while True:
                msg = await recv(other, timeout=30)
                if isinstance(msg, Frame):
                    other_frames.append(time.monotonic())

        reader = asyncio.create_task(read_other())
        p = Pair(s, fuzzed, other, other_frames, [], reader)
        yield p
        reader.cancel()


def _expected_code(data: bytes) -> str | None:
    """The error code a message must get (None: it may be fine)."""
    try:
        decode_client(data)
    except ProtocolError as exc:
        return exc.code
    return None


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(wire, min_size=5, max_size=30))
async def test_fuzzed_messages_to_a_live_session_get_errors_and_break_nothing(
    pair: Pair, batch: list[bytes]
) -> None:
    ws = pair.fuzzed
    for i, data in enumerate(batch):
        try:
            msg = decode_client(data)
            if isinstance(msg, Close):
                continue  # a valid close ends the session: not what this test is about
        except ProtocolError:
            pass
        await ws.send_bytes(data)
        await send(ws, Ping(i))
        errors: list[Error] = []
        while True:
            reply = await recv(ws, timeout=10)
            if isinstance(reply, Pong) and reply.id == i:
                break
            if isinstance(reply, Frame):
                pair.fuzzed_frames.append(time.monotonic())
            if isinstance(reply, Error):
                errors.append(reply)
        assert not any(e.fatal for e in errors), errors
        want = _expected_code(data)
        if want is not None:
            assert [e.code for e in errors] == [want], (data, errors)
            assert errors[0].message
    assert not ws.closed
    assert pair.served.service.engine is not None and pair.served.service.engine.failure is None


async def test_fuzzed_sessions_and_their_neighbour_keep_streaming(pair: Pair) -> None:
    """After a fuzz storm on one connection both sessions still get frames at their rate."""
    storm = [b"\xc1", _pack({"type": "action", "v": 1, "seq": -1}), b"", _pack([])] * 50
    for data in storm:
        await pair.fuzzed.send_bytes(data)
    t0 = time.monotonic()
    got = 0
    while time.monotonic() - t0 < 2.0:
        msg = await recv(pair.fuzzed, timeout=5)
        got += isinstance(msg, Frame)
    recent = [t for t in pair.other_frames if t >= t0]
    assert got >= 25 and len(recent) >= 25  # 25 fps for 2 s, with slack


async def test_fuzzed_messages_before_start_get_errors_and_open_nothing() -> None:
    async with serve(max_msgs_per_s=1e6, msg_burst=100_000) as s:
        ws = await s.connect()
        for i, data in enumerate([b"\x00", *VALID[:4], b"\xff" * 10, _pack({"v": 1})]):
            if isinstance(_maybe(data), Start | Resume):
                continue
            await ws.send_bytes(data)
            await send(ws, Ping(i))
            replies = []
            while True:
                reply = await recv(ws)
                if isinstance(reply, Pong):
                    break
                replies.append(reply)
            assert replies and all(isinstance(r, Error) and not r.fatal for r in replies)
        assert len(s.service.store) == 0


def _maybe(data: bytes) -> object:
    try:
        return decode_client(data)
    except ProtocolError:
        return None
