"""An asyncio Python client for the worldserve WebSocket protocol (v1).

    async with WorldClient("ws://127.0.0.1:8000/v1/ws") as client:
        started = await client.start("a snowy forest at night")  # at the model's fps (started.fps)
        await client.action(["forward"])
        async for ev in client.frames():     # FrameEvent: .msg (protocol.Frame), .image
            ...

Pull mode: ``await client.block()`` asks for the next block and returns its first frame.
The server starts a pull session's blocks no faster than the ``fps`` it was started with.

Blocks are never skipped: every block of an epoch arrives once, in order. A push block that
comes late is preceded by one ``skipped`` message (``frames`` display frames showed the
previous picture instead); ``skipped_frames`` adds them up (once per block, also when a
resume sends the block and its ``skipped`` again). ``fps`` and ``level`` are what the
session runs at now: ``started`` gives the admitted settings (maybe below what was asked)
and every ``degradation`` moves them. ``Frame.pts_us`` is the epoch's presentation clock
(docs/protocol.md, "Time"): one frame period a frame at the rate in force, later only by
skipped frames, continuing across resumes and migrations; schedule frames by it.

Messages are the ``protocol`` package's dataclasses (torch-free, shared with the server);
the client needs numpy, msgpack, aiohttp and Pillow (JPEG frames), PyAV only for H.264.
The client resumes by itself when the connection drops (not when the server ends the
session): it reconnects with backoff and sends ``resume`` with the session's token and the
next block_idx it has not received, so the stream continues with no gap and no repeat; in
pull mode it asks again for blocks it requested beyond what the server had accepted.

Several workers behind a router (docs/operations.md): ``WorldClient(router="http://...")``
asks the router for a worker and a reservation before ``start`` and, when its worker
cannot be reached, where to resume (a worker that died is replaced by one that restores
the session's last checkpoint: ``resumed.gap_blocks`` says how many blocks that cost).
A draining worker sends ``migrate``: the client follows it to the target and resumes
there, with no block lost or repeated (only to its host or ``allowed_hosts``, never
wss -> ws: clients/urls.py). ``migrations``, ``gaps`` and ``url`` tell what happened.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import AsyncIterator, Collection, Iterable
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import numpy as np

from worldserve.clients.urls import pinned, refusal
from worldserve.protocol import (
    Ack,
    Action,
    Block,
    ClientMessage,
    Close,
    CloseCode,
    Codec,
    Degradation,
    Ended,
    Error,
    ErrorCode,
    Frame,
    Image,
    Keyframe,
    Migrate,
    Mode,
    Observation,
    Ping,
    Pong,
    Prompt,
    ProtocolError,
    Resume,
    Resumed,
    ServerMessage,
    Skipped,
    Start,
    Started,
    decode_server,
)

log = logging.getLogger("worldserve.sdk")

# Errors after which resuming cannot help.
_FINAL = {ErrorCode.MISSING_SESSION_STATE, ErrorCode.BAD_TOKEN, ErrorCode.UNAUTHORIZED}


@dataclass(frozen=True, slots=True)
class FrameEvent:
    """A received frame: the message and, when decoding is on, the RGB image."""

    msg: Frame
    image: np.ndarray | None  # (H, W, 3) uint8

    @property
    def block_idx(self) -> int:
        return self.msg.block_idx


Event = FrameEvent | ServerMessage


class SessionEnded(Exception):
    """The session is over (ended by the server, or it could not be resumed)."""


class _Unreachable(Exception):
    """The router has no worker for us now: try again later."""


class _Decoder:
    """Frame bytes -> RGB array; one H.264 decoder per connection."""

    def __init__(self) -> None:
        self._h264: Any = None

    def reset(self) -> None:
        self._h264 = None

    def decode(self, msg: Frame) -> np.ndarray | None:
        if msg.codec == "raw":
            return np.frombuffer(msg.data, np.uint8).reshape(msg.height, msg.width, 3)
        if msg.codec == "jpeg":
            from PIL import Image as PILImage

            with PILImage.open(io.BytesIO(msg.data), formats=("JPEG", "PNG")) as img:  # no other decoder
                return np.asarray(img.convert("RGB"))
        try:
            import av
        except ImportError:
            raise RuntimeError(
                "decoding H.264 frames needs PyAV: pip install 'worldserve[h264]' "
                "(or start with codec='jpeg', or decode=False)"
            ) from None
        if self._h264 is None:
            self._h264 = av.CodecContext.create("h264", "r")
        out = None
        for frame in self._h264.decode(av.Packet(msg.data)):  # one access unit per message
            out = frame.to_ndarray(format="rgb24")
        return out


class WorldClient:
    def __init__(
        self,
        url: str | None = None,
        *,
        router: str | None = None,
        api_key: str | None = None,
        reconnect: bool = True,
        max_retries: int = 8,
        backoff_s: float = 0.1,
        decode: bool = True,
        queue_size: int = 256,
        http: aiohttp.ClientSession | None = None,
        allowed_hosts: Collection[str] = (),
    ) -> None:
        if url is None and router is None:
            raise ValueError("give a worker url (ws://host:port/v1/ws) or a router (http://host:port)")
        self.url = url or ""  # the worker now serving the session
        self.router = router.rstrip("/") if router else None
        self._secure, self.allowed_hosts = pinned(self.url or self.router or "", allowed_hosts)
        self.api_key = api_key
        self.reconnect = reconnect
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.decode = decode
        self.started: Started | None = None
        self.resumed: Resumed | None = None  # the last resume's reply
        self.reconnects = 0
        self.migrations = 0  # migrate messages followed
        self.gaps: list[Resumed] = []  # resumes from a snapshot that cost blocks
        self.dropped_events = 0  # events lost because the application read too slowly
        self.skipped_frames = 0  # display frames that repeated a picture (blocks came late)
        self.fps = 0.0  # the frame rate the session runs at now (started, then degradations)
        self.level = 0  # its degradation level now
        self._http = http
        self._own_http = http is None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._events: asyncio.Queue[Event | None] = asyncio.Queue(queue_size)
        self._connected = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._waiters: dict[tuple[str, int], asyncio.Future[ServerMessage]] = {}
        self._reply: asyncio.Future[ServerMessage] | None = None
        self._decoder = _Decoder()
        self._seq = 0
        self._ids = 0
        self._next_block = 0  # the first block not received (resume point)
        self._requested = -1  # pull: the highest block requested
        self._closing = False
        self._ended: Ended | Error | None = None
        self._migrate: Migrate | None = None  # where a draining worker sent us
        self._last_action: tuple[tuple[str, ...], tuple[float, float]] | None = None

    # --- lifecycle ---

    async def __aenter__(self) -> WorldClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def session_id(self) -> str | None:
        return self.started.session_id if self.started else None

    @property
    def ended(self) -> Ended | Error | None:
        """Why the session is over (``ended`` or a final error), or None."""
        return self._ended

    async def start(
        self,
        prompt: str = "",
        *,
        seed: int = 0,
        fps: float | None = None,
        bucket: int = 64,
        codec: Codec = "jpeg",
        mode: Mode = "push",
        lookahead: int = 1,
        quality: int | None = None,
        observation: np.ndarray | None = None,
        deadline_ms: float | None = None,
        timeout: float = 30.0,
    ) -> Started:
        """Open a session; raises ``SessionEnded`` with the server's error if refused. ``fps``
        None: the model's own rate (``started.fps`` says which)."""
        obs = Image.from_array(observation, "png") if observation is not None else None
        reservation = await self._place(timeout) if self.router else None
        msg = Start(prompt, seed, fps, bucket, codec, mode, lookahead, quality, obs, deadline_ms,
                    self.api_key, reservation)
        await self._open()
        reply = await self._request(msg, timeout)
        if not isinstance(reply, Started):
            raise SessionEnded(f"start refused: {reply!r}")
        self.started = reply
        self._connected.set()  # session messages may go now (not before: the server refuses them)
        if mode == "pull":
            self._requested = 0
        return reply

    async def close(self) -> None:
        """End the session (``close``), then the connection."""
        self._closing = True
        ws = self._ws
        if ws is not None and not ws.closed and self.started is not None and self._ended is None:
            with suppress(Exception):
                await ws.send_bytes(Close().encode())
        if ws is not None:
            with suppress(Exception):
                await asyncio.wait_for(ws.close(), 5.0)
        if self._reader is not None:
            self._reader.cancel()
            with suppress(asyncio.CancelledError):
                await self._reader
        if self._own_http and self._http is not None:
            await self._http.close()

    def simulate_drop(self) -> None:
        """Abort the TCP connection without a close handshake (tests, drills)."""
        ws = self._ws
        conn = getattr(ws, "_conn", None) if ws is not None else None
        transport = getattr(conn, "transport", None)
        if transport is not None:
            transport.abort()

    # --- receiving ---

    async def recv(self, timeout: float | None = None) -> Event:
        """The next event (frames and every other server message, in order)."""
        ev = await asyncio.wait_for(self._events.get(), timeout)
        if ev is None:
            self._events.put_nowait(None)  # keep the end marker for the next reader
            raise SessionEnded(repr(self._ended))
        return ev

    async def next_frame(self, timeout: float | None = None) -> FrameEvent:
        while True:
            ev = await self.recv(timeout)
            if isinstance(ev, FrameEvent):
                return ev

    async def frames(self) -> AsyncIterator[FrameEvent]:
        """Frames until the session ends (other events are skipped)."""
        while True:
            try:
                yield await self.next_frame()
            except SessionEnded:
                return

    # --- sending ---

    async def action(
        self, keys: Iterable[str] = (), mouse: tuple[float, float] = (0.0, 0.0)
    ) -> int:
        """Send the controls now; returns the action's seq (see ``Frame.action_seq``). The
        newest action always reaches the session, however fast they are sent."""
        self._seq += 1
        msg = Action(self._seq, tuple(keys), (float(mouse[0]), float(mouse[1])))
        self._last_action = (msg.keys, (msg.mouse[0], msg.mouse[1]))
        await self._send(msg)
        return self._seq

    async def prompt(self, text: str, *, wait: bool = True, timeout: float = 10.0) -> int:
        """Change the scene; with ``wait`` returns after the server's ack. Returns the id."""
        self._ids += 1
        pid = self._ids
        if wait:
            await self._await_ack(Prompt(text, pid), ("prompt", pid), timeout)
        else:
            await self._send(Prompt(text, pid))
        return pid

    async def observe(self, frame: np.ndarray, *, timeout: float = 10.0) -> int:
        """Send a real frame that re-anchors the model; returns after the ack."""
        self._ids += 1
        oid = self._ids
        await self._await_ack(Observation(Image.from_array(frame, "png"), oid), ("observation", oid), timeout)
        return oid

    async def request(self, block_idx: int | None = None, deadline_ms: float | None = None) -> int:
        """Pull mode: ask for a block (default: the one after the last requested)."""
        n = self._requested + 1 if block_idx is None else block_idx
        if n == 0:  # a new epoch
            self._next_block = 0
        await self._send(Block(n, deadline_ms))
        self._requested = max(self._requested, n) if n else 0
        return n

    async def block(self, block_idx: int | None = None, *, timeout: float = 30.0) -> FrameEvent:
        """Pull mode: request a block and return its first frame (skipping other events)."""
        n = await self.request(block_idx)
        while True:
            ev = await self.next_frame(timeout)
            if ev.block_idx == n:
                return ev

    async def keyframe(self) -> None:
        await self._send(Keyframe())

    async def ping(self, timeout: float = 10.0) -> float:
        """Round-trip time in seconds."""
        loop = asyncio.get_running_loop()
        self._ids += 1
        t0 = loop.time()
        fut = self._waiter(("pong", self._ids))
        await self._send(Ping(self._ids))
        await asyncio.wait_for(fut, timeout)
        return loop.time() - t0

    # --- internals ---

    async def _open(self) -> None:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        old, self._ws = self._ws, None
        if old is not None and not old.closed:
            with suppress(Exception):
                await asyncio.wait_for(old.close(), 1.0)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        self._ws = await self._http.ws_connect(self.url, headers=headers, max_msg_size=1 << 26)  # 64 MiB
        self._decoder.reset()
        if self._reader is None:
            self._reader = asyncio.create_task(self._read_loop(), name="worldclient-reader")

    async def _request(self, msg: ClientMessage, timeout: float) -> ServerMessage:
        """Send a session message and wait for started/resumed or an error."""
        fut = self._reply = _future()
        await self._send(msg, wait_connected=False)
        return await asyncio.wait_for(fut, timeout)

    async def _request_inline(self, msg: ClientMessage, timeout: float) -> ServerMessage:
        """``_request`` from inside the reader task: read the replies here."""
        fut = self._reply = _future()
        ws = self._ws
        assert ws is not None
        await ws.send_bytes(msg.encode())
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not fut.done():
            raw = await ws.receive(timeout=max(0.01, end - loop.time()))
            if raw.type is not aiohttp.WSMsgType.BINARY:
                raise ConnectionError(f"connection closed while resuming ({raw.type!r})")
            self._on_message(raw.data)
        return fut.result()

    def _waiter(self, key: tuple[str, int]) -> asyncio.Future[ServerMessage]:
        fut = self._waiters[key] = _future()
        return fut

    async def _await_ack(self, msg: ClientMessage, key: tuple[str, int], timeout: float) -> None:
        fut = self._waiter(key)
        await self._send(msg)
        try:
            await asyncio.wait_for(fut, timeout)
        finally:
            self._waiters.pop(key, None)

    async def _send(self, msg: ClientMessage, *, wait_connected: bool = True) -> None:
        if self._ended is not None:
            raise SessionEnded(repr(self._ended))
        if wait_connected:
            async with asyncio.timeout(60.0):
                while not self._connected.is_set():  # woken, then cleared again before this ran: wait on
                    await self._connected.wait()
        ws = self._ws
        if ws is None:
            raise SessionEnded("not connected")
        with suppress(ConnectionError, RuntimeError):  # dropped: the reader resumes
            await ws.send_bytes(msg.encode())

    def _emit(self, ev: Event | None) -> None:
        if self._events.full():
            with suppress(asyncio.QueueEmpty):
                self._events.get_nowait()
                self.dropped_events += 1
        self._events.put_nowait(ev)

    async def _read_loop(self) -> None:
        try:
            while True:
                ws = self._ws
                assert ws is not None
                async for raw in ws:
                    if raw.type is aiohttp.WSMsgType.BINARY:
                        self._on_message(raw.data)
                    elif raw.type is aiohttp.WSMsgType.ERROR:
                        break
                self._connected.clear()
                if self._closing or self._ended is not None:
                    break
                if self._migrate is None and not self._resumable(ws):
                    break
                if not await self._resume():
                    break
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("client reader failed")
        finally:
            self._connected.clear()
            self._fail_waiters()
            self._emit(None)

    def _resumable(self, ws: aiohttp.ClientWebSocketResponse) -> bool:
        if not self.reconnect or self.started is None:
            return False
        return ws.close_code not in (CloseCode.POLICY, CloseCode.NORMAL, CloseCode.GOING_AWAY)

    async def _resume(self) -> bool:
        assert self.started is not None
        for attempt in range(self.max_retries):
            if attempt or self._migrate is None:
                await asyncio.sleep(self.backoff_s * (2**attempt))
            try:
                await self._locate()
                await self._open()
                reply = await self._request_inline(
                    Resume(self.started.session_id, self.started.token, self._next_block), 10.0
                )
            except (aiohttp.ClientError, OSError, TimeoutError, ConnectionError, _Unreachable) as exc:
                log.info("resume attempt %d failed: %s", attempt + 1, exc)
                continue
            except SessionEnded as exc:
                log.info("session cannot be resumed: %s", exc)
                return False
            if isinstance(reply, Resumed):
                self.resumed = reply
                if reply.token is not None:  # the server replaced the token: the old one is spent
                    self.started = replace(self.started, token=reply.token)
                self.reconnects += 1
                self._next_block = reply.block_idx
                if reply.gap_blocks:
                    self.gaps.append(reply)
                if self.started.mode == "pull":
                    for n in range(max(reply.requested + 1, 1), self._requested + 1):
                        await self._send(Block(n), wait_connected=False)
                if self._last_action is not None:  # the newest controls win on the new worker too
                    self._seq += 1
                    keys, mouse = self._last_action
                    await self._send(Action(self._seq, keys, mouse), wait_connected=False)
                self._connected.set()  # only now: an action sent before ``resume`` is refused
                return True
            if isinstance(reply, Error) and reply.code in _FINAL:
                self._ended = reply
                return False
        return False

    async def _locate(self) -> None:
        """Point ``self.url`` at the worker to resume on: a migrate's target first, else
        what the router says (it replaces a dead worker), else the same worker again."""
        m, self._migrate = self._migrate, None
        if m is not None and m.url:
            self.url = self._followed(m.url, "a migrate")
            self.migrations += 1
            return
        if m is not None and m.retry_after:
            await asyncio.sleep(m.retry_after)
        if self.router is None:
            return
        assert self.started is not None and self._http is not None
        body = {"session_id": self.started.session_id}
        async with self._http.post(f"{self.router}/v1/resume", json=body) as resp:
            answer = await resp.json(content_type=None)
        if resp.status == 200:
            self.url = self._followed(answer["url"], "the router's resume")
            return
        if resp.status == 404:
            self._ended = Error(ErrorCode.MISSING_SESSION_STATE, str(answer.get("message")))
            raise SessionEnded(answer.get("message"))
        raise _Unreachable(f"router answered {resp.status}: {answer.get('message')}")

    def _followed(self, url: object, what: str) -> str:
        """``url`` if this client may go there (see ``allowed_hosts``); else SessionEnded."""
        if (why := refusal(url, self._secure, self.allowed_hosts, what)) is not None:
            raise SessionEnded(why)
        return str(url)

    async def _place(self, timeout: float) -> str:
        """Ask the router for a worker and a reservation; sets ``self.url``."""
        if self._http is None:
            self._http = aiohttp.ClientSession()
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            async with self._http.post(f"{self.router}/v1/place", headers=headers) as resp:
                answer = await resp.json(content_type=None)
            if resp.status == 200:
                self.url = self._followed(answer["url"], "the router's place")
                return str(answer["session_id"])
            wait = float(answer.get("retry_after") or 0) if resp.status == 503 else 0.0
            if not wait or loop.time() + wait > end:
                raise SessionEnded(f"the router cannot place a session: {answer}")
            await asyncio.sleep(wait)

    def _on_message(self, data: bytes) -> None:
        try:
            msg = decode_server(data)
        except ProtocolError as exc:
            log.warning("bad server message: %s", exc)
            return
        if isinstance(msg, Frame):
            image = self._decoder.decode(msg) if self.decode else None
            if msg.frame + 1 == self.block_start(msg.block_idx + 1):  # the block's last frame
                self._next_block = msg.block_idx + 1
            self._emit(FrameEvent(msg, image))
            return
        if isinstance(msg, Started | Resumed):
            self.fps, self.level = msg.fps, msg.level
        elif isinstance(msg, Degradation):
            self.fps, self.level = msg.fps, msg.new_level
        elif isinstance(msg, Skipped) and msg.block_idx >= self._next_block:  # not one sent again
            self.skipped_frames += msg.frames
        if isinstance(msg, Started | Resumed | Error) and self._reply is not None and not self._reply.done():
            if not isinstance(msg, Error) or msg.code not in (ErrorCode.RUNNER_ERROR, ErrorCode.RATE_LIMITED):
                self._reply.set_result(msg)
        if isinstance(msg, Ack):
            self._resolve((msg.of, msg.id), msg)
        elif isinstance(msg, Pong):
            self._resolve(("pong", msg.id), msg)
        elif isinstance(msg, Migrate):
            self._migrate = msg  # followed once the socket closes
            self._connected.clear()  # the source has let the session go: hold messages for the target
        elif isinstance(msg, Ended) and not (msg.reason == "migrated" and self._migrate):
            self._ended = msg
        elif isinstance(msg, Error) and msg.fatal and msg.code in _FINAL:
            self._ended = msg
        self._emit(msg)

    def block_start(self, block_idx: int) -> int:
        """The epoch frame index of block ``block_idx``'s first frame: block 0 holds
        ``started.first_chunk_frames`` frames (a latent model's first block is shorter),
        every later block ``started.chunk_frames``."""
        st = self.started
        if st is None or block_idx <= 0:
            return 0
        first = st.chunk_frames if st.first_chunk_frames is None else st.first_chunk_frames
        return first + (block_idx - 1) * st.chunk_frames

    def _resolve(self, key: tuple[str, int], msg: ServerMessage) -> None:
        fut = self._waiters.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def _fail_waiters(self) -> None:
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(SessionEnded("connection closed"))
        self._waiters.clear()
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(SessionEnded("connection closed"))


def _future() -> asyncio.Future[ServerMessage]:
    """A future whose exception counts as seen even if its waiter gave up."""
    fut: asyncio.Future[ServerMessage] = asyncio.get_running_loop().create_future()
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())
    return fut
