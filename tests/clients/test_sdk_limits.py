"""What a hostile server or client cannot make the other side parse: images open with their
own PIL decoder only (no other format's parser runs on the bytes), and the SDK reads no
message over 64 MiB."""

from __future__ import annotations

import asyncio
import contextlib
import io
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from PIL import BmpImagePlugin, GifImagePlugin
from PIL import Image as PILImage

from worldserve.clients.sdk import SessionEnded, WorldClient, _Decoder
from worldserve.protocol import Frame, Image, ProtocolError


def _encoded(fmt: str) -> bytes:
    buf = io.BytesIO()
    PILImage.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buf, fmt)
    return buf.getvalue()


@pytest.fixture
def other_parsers_run(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The formats whose parsers were entered (BMP and GIF here: parsers a client's image
    must never reach)."""
    entered: list[str] = []
    for plugin in (BmpImagePlugin.BmpImageFile, GifImagePlugin.GifImageFile):
        real = plugin._open

        def spy(self: Any, _real: Any = real, _name: str = plugin.format) -> None:
            entered.append(_name)
            _real(self)

        monkeypatch.setattr(plugin, "_open", spy)
    return entered


@pytest.mark.parametrize("fmt", ["BMP", "GIF"])
@pytest.mark.parametrize("claimed", ["png", "jpeg"])
def test_an_observation_in_another_format_is_refused_without_its_parser_running(
        other_parsers_run: list[str], fmt: str, claimed: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        Image(claimed, _encoded(fmt)).decode()  # type: ignore[arg-type]
    assert refused.value.field == "data"
    assert other_parsers_run == []
    assert Image("png", _encoded("PNG")).decode().shape == (8, 8, 3)  # its own format still reads


def test_the_sdk_decodes_a_jpeg_frame_without_running_another_parser(other_parsers_run: list[str]) -> None:
    frame = Frame("s", 0, 0, 0, 0, "jpeg", 8, 8, _encoded("BMP"), True, 0.0, 0.0)
    with pytest.raises(Exception):  # noqa: B017 - PIL's "cannot identify image file"
        _Decoder().decode(frame)
    assert other_parsers_run == []
    ok = Frame("s", 0, 0, 0, 0, "jpeg", 8, 8, _encoded("JPEG"), True, 0.0, 0.0)
    assert _Decoder().decode(ok).shape == (8, 8, 3)  # type: ignore[union-attr]


async def test_the_sdk_reads_no_message_over_64_mib() -> None:
    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse(max_msg_size=0)
        await sock.prepare(request)
        await sock.receive()  # the start
        with contextlib.suppress(ConnectionError):
            await sock.send_bytes(b"\x00" * ((64 << 20) + 1))
            await sock.receive()
        return sock

    app = web.Application()
    app.router.add_get("/v1/ws", ws)
    async with TestServer(app, host="127.0.0.1") as server:
        async with WorldClient(str(server.make_url("/v1/ws")), reconnect=False) as client:
            t0 = asyncio.get_running_loop().time()
            with pytest.raises(SessionEnded, match="connection closed"):  # not read, not waited out
                await asyncio.wait_for(client.start(codec="raw"), 20.0)
            assert asyncio.get_running_loop().time() - t0 < 10.0
