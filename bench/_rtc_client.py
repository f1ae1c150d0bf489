"""A minimal aiortc peer for ``POST /v1/rtc/offer``, the benches' and the tests' WebRTC client (a
browser is the users' one).

    async with RtcClient("http://127.0.0.1:8000") as c:
        answer = await c.connect(start={"prompt": "a green forest", "bucket": 64})
        frame = await c.next_frame()          # (arrival monotonic time, av.VideoFrame)
        seq = c.action(["forward"])           # on the 'actions' channel
        ack = await c.prompt("a snowy forest") # on 'control', waits for the ack
        migrate, _ = await c.message(Migrate)  # the worker drains ...
        await c.follow(migrate)                # ... re-offer to the target with resume

It opens the same channels a browser does: ``control`` (reliable) and ``actions``
(unordered, ``maxRetransmits=0``), with empty ``iceServers`` (and 127.0.0.1 candidates
where the box has nothing else, as the server does).

One client holds one session over any number of peer connections: ``connect`` again
(``follow`` after a ``migrate``, or a ``resume`` after a drop) hangs up the current one
first, keeps the action ``seq`` counting on and keeps the session's token. ``frames``
holds the current connection's frames; ``messages`` every connection's control messages,
in order of arrival.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from contextlib import suppress
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError

from worldserve.protocol import (
    Ack,
    Action,
    ClientMessage,
    Close,
    Ended,
    Migrate,
    Prompt,
    ServerMessage,
    decode_server,
)
from worldserve.server.rtc.ice import add_loopback_candidates, wants_loopback
from worldserve.server.settings import Loopback


class OfferRefused(Exception):
    """The server answered the offer with an error (``status``, ``body``)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        super().__init__(f"{status}: {body.get('error')}: {body.get('message')}")


def http_base(url: str) -> str:
    """A worker's http(s) base URL from its WebSocket URL (a ``migrate`` message's
    ``url``, ``ws://host:port/v1/ws``): where its ``/v1/rtc/offer`` is."""
    parts = urlsplit(url)
    scheme = {"wss": "https", "ws": "http"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "", "", ""))


class RtcClient:
    def __init__(
        self,
        base_url: str,
        *,
        loopback: Loopback = "auto",
        max_frames: int = 256,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.loopback = loopback
        self.pc: RTCPeerConnection | None = None
        self.control: RTCDataChannel | None = None
        self.actions: RTCDataChannel | None = None
        self.answer: dict[str, Any] = {}
        self.frames: deque[tuple[float, Any]] = deque(maxlen=max_frames)
        self.messages: deque[tuple[float, ServerMessage, dict[str, Any]]] = deque(maxlen=1024)
        self.frames_received = 0
        self._frame_event = asyncio.Event()
        self._message_event = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._control_open = asyncio.Event()
        self.control_closed = asyncio.Event()  # the current control channel closed
        self.session_id: str | None = None
        self.token: str | None = None  # from ``started`` (``resumed`` does not repeat it)
        self._seq = 0
        self._ids = 0
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RtcClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close(send_close=False)

    @property
    def session(self) -> dict[str, Any]:
        s: dict[str, Any] = self.answer.get("session", {})
        return s

    async def connect(
        self,
        start: dict[str, Any] | None = None,
        resume: dict[str, Any] | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 20.0,
        wait_open: bool = True,
    ) -> dict[str, Any]:
        """Offer, post, answer (and, with ``wait_open``, wait for the control channel);
        returns the answer JSON. ``OfferRefused`` on an error. A peer connection this
        client still has is hung up first."""
        await self._hang_up()
        self.frames.clear()
        self._control_open = opened = asyncio.Event()
        self.control_closed = closed = asyncio.Event()
        pc = self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("video", direction="recvonly")
        self.control = pc.createDataChannel("control")
        self.actions = pc.createDataChannel("actions", ordered=False, maxRetransmits=0)
        self.control.on("message", self._on_message)
        self.control.on("open", opened.set)
        self.control.on("close", closed.set)
        pc.on("track", self._on_track)
        if wants_loopback(self.loopback):
            add_loopback_candidates(pc)
        await pc.setLocalDescription(await pc.createOffer())
        body: dict[str, Any] = {"type": "offer", "sdp": pc.localDescription.sdp}
        if start is not None:
            body["start"] = start
        if resume is not None:
            body["resume"] = resume
        if api_key is not None:
            body["api_key"] = api_key
        self._http = self._http or aiohttp.ClientSession()
        async with self._http.post(
            f"{self.base_url}/v1/rtc/offer", json=body, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            data: dict[str, Any] = await resp.json()
            if resp.status != 200:
                raise OfferRefused(resp.status, data)
        self.answer = data
        self.session_id = self.session.get("session_id", self.session_id)
        token = self.session.get("token") or (resume or {}).get("token")
        self.token = token if isinstance(token, str) else self.token
        await pc.setRemoteDescription(RTCSessionDescription(data["sdp"], data["type"]))
        if wait_open:
            await asyncio.wait_for(opened.wait(), timeout)
        return data

    async def follow(self, migrate: Migrate, *, timeout: float = 20.0) -> dict[str, Any]:
        """Continue the session where a ``migrate`` message sends it: hang up, then offer
        to the target worker with ``resume`` (session_id, token, the migrate's block_idx),
        as the browser client does. Returns the answer (its ``session`` is ``resumed``)."""
        if not migrate.url:
            raise ValueError(
                f"migrate names no worker (retry_after {migrate.retry_after}): ask the router"
            )
        if self.token is None or migrate.session_id != self.session_id:
            raise ValueError(f"migrate is for session {migrate.session_id!r}, not this client's")
        self.base_url = http_base(migrate.url)
        resume = {"session_id": migrate.session_id, "token": self.token,
                  "block_idx": migrate.block_idx}
        return await self.connect(resume=resume, timeout=timeout)

    async def next_frame(self, timeout: float = 10.0) -> tuple[float, Any]:
        """The oldest unread decoded frame: (arrival time on the monotonic clock, frame)."""
        end = time.monotonic() + timeout
        while not self.frames:
            self._frame_event.clear()
            await asyncio.wait_for(self._frame_event.wait(), max(0.001, end - time.monotonic()))
        return self.frames.popleft()

    async def fresh_frame(self, timeout: float = 10.0) -> tuple[float, Any]:
        """The next frame to arrive from now on (older ones are dropped)."""
        self.frames.clear()
        return await self.next_frame(timeout)

    async def message(self, kind: type, timeout: float = 10.0) -> tuple[ServerMessage, dict[str, Any]]:
        """The next control message of type ``kind`` (older ones of other types dropped)."""
        end = time.monotonic() + timeout
        while True:
            while self.messages:
                _, msg, wire = self.messages.popleft()
                if isinstance(msg, kind):
                    return msg, wire
            self._message_event.clear()
            await asyncio.wait_for(self._message_event.wait(), max(0.001, end - time.monotonic()))

    def send(self, msg: ClientMessage) -> None:
        assert self.control is not None
        self.control.send(msg.encode())

    def action(self, keys: list[str] | tuple[str, ...] = (), mouse: tuple[float, float] = (0.0, 0.0)) -> int:
        assert self.actions is not None
        self._seq += 1
        self.actions.send(Action(self._seq, tuple(keys), mouse).encode())
        return self._seq

    async def prompt(self, text: str, timeout: float = 10.0) -> Ack:
        self._ids += 1
        self.send(Prompt(text, self._ids))
        while True:
            msg, _ = await self.message(Ack, timeout)
            assert isinstance(msg, Ack)
            if msg.id == self._ids:
                return msg

    async def close(self, *, send_close: bool = True) -> None:
        """End the session (``close`` on control) unless told not to, then hang up."""
        if send_close and self.control is not None and self.control.readyState == "open":
            self.send(Close("client done"))
            with suppress(TimeoutError):  # the server answers 'ended' (then hangs up)
                await self.message(Ended, 5.0)
        await self._hang_up()
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _hang_up(self) -> None:
        """Stop reading video and close the current peer connection (if any)."""
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, MediaStreamError):
                pass
            self._reader = None
        if self.pc is not None:
            await self.pc.close()
            self.pc = None

    def _on_message(self, data: bytes | str) -> None:
        import msgpack

        if isinstance(data, bytes):
            wire = msgpack.unpackb(data, raw=False)
            self.messages.append((time.monotonic(), decode_server(data), wire))
            self._message_event.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "video":
            self._reader = asyncio.create_task(self._read(track))

    async def _read(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                frame = await track.recv()
                self.frames.append((time.monotonic(), frame))
                self.frames_received += 1
                self._frame_event.set()
        except (MediaStreamError, asyncio.CancelledError):
            pass
