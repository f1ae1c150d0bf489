"""The WebSocket transport: one ``Connection`` per socket, at most one session on it.

A reader loop decodes and validates each message (protocol/codec.py) and hands it to
the service (server/dispatch.py, shared with WebRTC; ``start`` and ``resume`` are handled
here); a bad message gets an ``error`` and the session goes on. A writer task is
the only one that sends. What waits for it is bounded, so a client that stops reading
never grows server memory: control messages in a deque (oldest dropped past
``control_queue``), pull and replayed blocks in an ordered deque (``send_queue``), push
frames in a one-slot holder, the only latest-wins holder on a frame's way out (its frames
are counted as ``slow_client`` drops; push chunks reach it already paced, at their display
time: server/engine_events.py). A push chunk's first frame goes out when it arrives and
each next one a frame period after the one before (``pts_step_us``), as the WebRTC track
does; a newer chunk that arrives while an older one's frames are still going out wins (the
rest of the older one is dropped and counted). Pull and replayed blocks go out at once.
Frames are encoded only when sent, so a dropped frame costs nothing, and off the loop: the
writer hands each frame to the app's codec pool (server/offload.py) and waits for it before
the next, so a connection's frames go out in order and its encoder (H.264 keeps state) is
used by one call at a time. While the client does not read, the writer waits in aiohttp's
drain and everything else keeps running.
A ``skipped`` goes out right before the frames of the late block it is about, naming the
block this client was last sent as the one it kept showing.

Over the message rate limit a message is dropped, except an action: the newest controls
must reach the session whatever the rate (a game that sends its state at a high rate
depends on it), so a small over-rate message is still read, and an action among them is
coalesced like any other (latest wins).

Close codes: 1008 auth/policy, 1009 too big (aiohttp enforces ``max_msg_size``), 1011
internal error, 1013 at capacity or not ready (with ``retry_after`` in the error).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from contextlib import suppress

import numpy as np
from aiohttp import WSMsgType, web

from worldserve.protocol import (
    ClientMessage,
    CloseCode,
    Ended,
    Error,
    ErrorCode,
    Frame,
    ProtocolError,
    Resume,
    Resumed,
    Save,
    ServerMessage,
    Skipped,
    Start,
    Started,
    Status,
    error_from,
)
from worldserve.server.auth import authorized, presented_key
from worldserve.server.dispatch import Inbound, dispatch
from worldserve.server.encode import FrameEncoder, make_encoder
from worldserve.server.live import Chunk, NotReady
from worldserve.server.metrics import Metrics
from worldserve.server.offload import CodecPool
from worldserve.server.quotas import OverQuota, clients
from worldserve.server.remote import DirectoryUnavailable, PlacementRequired
from worldserve.server.saved import worlds_of
from worldserve.server.service import Service
from worldserve.server.settings import Settings
from worldserve.server.store import StoreError
from worldserve.session.errors import AtCapacity, BadToken, SessionError

log = logging.getLogger("worldserve.ws")
DIRECTORY_DOWN = "the session directory cannot be reached; retry later"  # its address stays in the log


class Connection:
    """One WebSocket and the session attached to it (implements ``service.Peer`` and
    ``dispatch.Transport``)."""

    def __init__(
        self,
        ws: web.WebSocketResponse,
        request: web.Request,
        service: Service,
        settings: Settings,
        metrics: Metrics,
        codecs: CodecPool,
    ) -> None:
        self.ws = ws
        self.request = request
        self.service = service
        self.settings = settings
        self.metrics = metrics
        self.codecs = codecs  # frame encoding runs here, off the loop
        self.sid: str | None = None
        self.codec = "jpeg"
        self._encoder: FrameEncoder | None = None
        self._control: deque[bytes] = deque()
        self._status: bytes | None = None  # the newest status message (latest wins)
        self._ordered: deque[Chunk] = deque()
        self._latest: Chunk | None = None
        self._paced: tuple[Chunk, int, float] | None = None  # push: (chunk, next frame, when due)
        self._wake = asyncio.Event()
        self._closing: tuple[int, str] | None = None
        self._closed = asyncio.Event()
        self._keyframe = False
        self._last_block = -1  # the newest block sent (what the client shows)
        self._last_frame: tuple[int, int] | None = None  # (action_seq, frame index) last sent
        self._inbound = Inbound(settings, metrics)
        self._start_at: float | None = None  # monotonic time of the start message (TTFF)
        self._sent_window: deque[float] = deque(maxlen=512)  # send times, for the fps figure
        self.drops = 0  # frames replaced or pushed out before they were sent (slow client)
        self.control_drops = 0
        self.frames_sent = 0

    # --- Peer (called by the service; never waits) ---

    def attached(self, reply: Started | Resumed, quality: int) -> None:
        if self._encoder is not None:
            self._encoder.close()
        self.sid = reply.session_id
        self.codec = reply.codec
        self._encoder = make_encoder(reply.codec, quality=quality, fps=reply.fps)
        self._keyframe = True
        self._ordered.clear()
        self._latest = self._paced = None
        self._last_block = -1
        self.send(reply)

    def send(self, msg: ServerMessage) -> None:
        self._queue_control(msg.encode())

    def chunk(self, chunk: Chunk, *, ordered: bool) -> None:
        if self._closing is not None:
            return
        if ordered:
            if len(self._ordered) >= max(self.settings.send_queue, self.settings.replay_blocks):
                self._count_drop(self._ordered.popleft())
            self._ordered.append(chunk)
        else:
            if self._latest is not None:
                self._count_drop(self._latest)
            self._latest = chunk
        self._wake.set()

    def end(self, ended: Ended, code: int) -> None:
        """The session ended: tell the client, then close the socket."""
        if ended.session_id == self.sid:
            self.sid = None
        self._queue_control(ended.encode())
        self._begin_close(code, ended.reason)

    # --- dispatch.Transport (and ``send`` above) ---

    def need_session(self) -> str:
        if self.sid is None:
            raise ProtocolError(
                "no session on this connection: send start or resume first", "type",
                ErrorCode.NOT_STARTED,
            )
        return self.sid

    def request_keyframe(self) -> None:
        self._keyframe = True

    # --- public ---

    @property
    def queued(self) -> int:
        """Frames waiting to be sent (bounded)."""
        return len(self._ordered) + (self._latest is not None) + (self._paced is not None)

    @property
    def queued_control(self) -> int:
        return len(self._control) + (self._status is not None)

    async def close(self, code: int = CloseCode.GOING_AWAY, reason: str = "shutdown") -> None:
        """Close from the server side (shutdown): flush control messages, then close."""
        self._begin_close(code, reason)
        try:
            await asyncio.wait_for(self._closed.wait(), self.settings.close_timeout_s + 1.0)
        except TimeoutError:
            self._abort()

    async def run(self) -> None:
        """Serve the socket until it closes; then detach the session (resumable)."""
        writer = asyncio.create_task(self._write_loop(), name="ws-writer")
        status = asyncio.create_task(self._status_loop(), name="ws-status")
        self.metrics.connections.inc()
        try:
            async for msg in self.ws:
                if self._closing is not None:  # its session ended (a hand-off, a delete) or it was
                    break  # refused: what crossed that on the wire is not read (nor refused as not_started)
                if msg.type is WSMsgType.BINARY:
                    await self._on_bytes(msg.data)
                elif msg.type is WSMsgType.TEXT:
                    self._error(ProtocolError("text frames are not accepted: send binary msgpack"))
                elif msg.type is WSMsgType.ERROR:
                    if self.ws.close_code == CloseCode.TOO_BIG:
                        self.metrics.errors.labels(ErrorCode.TOO_BIG).inc()
                    break
                if self._closing is not None:
                    break
        finally:
            status.cancel()
            if self._closing is not None and not writer.done():
                with suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(writer), self.settings.close_timeout_s)
            writer.cancel()
            with suppress(asyncio.CancelledError):
                await writer
            if not self.ws.closed:
                with suppress(Exception):
                    await asyncio.wait_for(self.ws.close(), self.settings.close_timeout_s)
                if not self.ws.closed:
                    self._abort()
            if self.sid is not None:
                sid, self.sid = self.sid, None
                await self.service.disconnected(sid, self)
            if self._encoder is not None:
                self._encoder.close()
            self.metrics.connections.dec()
            self._closed.set()

    # --- reading ---

    async def _on_bytes(self, data: bytes) -> None:
        if not self._inbound.admit(self._send_error):
            self._over_rate(data)
            return
        try:
            await self._dispatch(self._inbound.decode(data))
        except ProtocolError as exc:
            fatal = exc.code == ErrorCode.UNAUTHORIZED
            self._error(exc, fatal=fatal, code=CloseCode.POLICY if fatal else None)
        except NotReady as exc:
            self._error(exc, fatal=True, code=CloseCode.TRY_AGAIN, retry_after=exc.retry_after)
        except DirectoryUnavailable as exc:  # multi-worker: refuse rather than misplace
            log.warning("directory unavailable: %s", exc, extra={"sid": self.sid})
            self._error(exc, fatal=True, code=CloseCode.TRY_AGAIN, retry_after=1.0, message=DIRECTORY_DOWN)
        except PlacementRequired as exc:
            self._error(exc, fatal=True, code=CloseCode.POLICY)
        except (AtCapacity, OverQuota) as exc:
            self._error(exc, fatal=True, code=CloseCode.TRY_AGAIN, retry_after=exc.retry_after_s)
        except BadToken as exc:
            self._error(exc, fatal=True, code=CloseCode.POLICY)
        except (SessionError, StoreError) as exc:  # a store's refusal (saved worlds) changes nothing
            self._error(exc)
        except Exception as exc:
            log.exception("message handler failed", extra={"sid": self.sid})
            self._error(exc, fatal=True, code=CloseCode.INTERNAL, message="internal server error")

    def _over_rate(self, data: bytes) -> None:
        """A message over the rate limit: dropped, unless it is an action (see the module
        docstring)."""
        msg = self._inbound.over_rate_action(data)
        if self.sid is not None and msg is not None:
            with suppress(SessionError):
                self.service.inputs.action(self.sid, msg)

    async def _dispatch(self, msg: ClientMessage) -> None:
        if isinstance(msg, Start):
            self._need_no_session()
            self._authorize(msg.api_key)
            self._start_at = time.monotonic()
            who = clients(self.request.remote, presented_key(self.request.headers, msg.api_key))
            if msg.world is not None:  # a fork of a saved world (server/saved.py)
                await worlds_of(self.request.app).fork(msg, self, who)
            else:
                await self.service.start(msg, self, who)
        elif isinstance(msg, Resume):
            self._need_no_session()
            await self.service.resume(msg, self)
        elif isinstance(msg, Save):
            self.send(await worlds_of(self.request.app).save(self.need_session(), msg.name))
        else:
            await dispatch(self.service, self, msg)

    def _need_no_session(self) -> None:
        if self.sid is not None:
            raise ProtocolError(
                f"session {self.sid} is already on this connection (one per connection)",
                "type", ErrorCode.ALREADY_STARTED,
            )

    def _authorize(self, key: str | None) -> None:
        if not authorized(self.request.headers, self.settings.api_keys, key):
            raise ProtocolError(
                "an API key is required to start a session (api_key field or "
                "Authorization: Bearer header)", "api_key", ErrorCode.UNAUTHORIZED,
            )

    def _error(
        self,
        exc: Exception,
        *,
        fatal: bool = False,
        code: int | None = None,
        retry_after: float | None = None,
        message: str | None = None,
    ) -> None:
        err = error_from(exc, fatal=fatal, retry_after=retry_after)
        if message is not None:
            err = Error(err.code, message, err.field, err.retry_after, err.fatal)
        self._send_error(err)
        if fatal and code is not None:
            self._begin_close(code, err.code)

    def _send_error(self, err: Error) -> None:
        self.metrics.errors.labels(err.code).inc()
        self.send(err)

    # --- writing ---

    def _queue_control(self, data: bytes) -> None:
        if len(self._control) >= self.settings.control_queue:
            self._control.popleft()
            self.control_drops += 1
        self._control.append(data)
        self._wake.set()

    def _count_drop(self, chunk: Chunk, sent: int = 0) -> None:
        """The frames of ``chunk`` from ``sent`` on, replaced or pushed out before they were sent."""
        n = len(chunk.frames) - sent
        self.drops += n
        self.metrics.drops.labels("slow_client").inc(n)

    def _begin_close(self, code: int, reason: str) -> None:
        if self._closing is None:
            self._closing = (code, reason)
            self._ordered.clear()
            self._latest = self._paced = None
        self._wake.set()

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._next_work()
                while True:
                    if self._control:
                        await self.ws.send_bytes(self._control.popleft())
                    elif self._status is not None and self._closing is None:
                        data, self._status = self._status, None
                        await self.ws.send_bytes(data)
                    elif self._closing is not None:
                        code, reason = self._closing
                        await asyncio.wait_for(
                            self.ws.close(code=code, message=reason.encode()[:120]),
                            self.settings.close_timeout_s,
                        )
                        return
                    elif self._ordered:
                        await self._send_chunk(self._ordered.popleft())
                    elif self._latest is not None:
                        chunk, self._latest = self._latest, None
                        if self._paced is not None:  # a newer chunk wins over the rest of it
                            self._count_drop(self._paced[0], self._paced[1])
                        self._paced = (chunk, 0, time.monotonic())
                    elif self._paced is not None and self._paced[2] <= time.monotonic():
                        await self._send_paced(*self._paced)
                    else:
                        break
        except asyncio.CancelledError:
            raise
        except (ConnectionError, TimeoutError, RuntimeError) as exc:
            log.info("send failed: %s", exc, extra={"sid": self.sid})
            self._abort()
        except Exception:
            log.exception("writer failed", extra={"sid": self.sid})
            self._abort()

    async def _next_work(self) -> None:
        """Wait until something is queued, or until a paced push frame is due."""
        due = None if self._paced is None else self._paced[2] - time.monotonic()
        if due is None:
            await self._wake.wait()
        elif due > 0:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), due)
        self._wake.clear()

    async def _send_paced(self, chunk: Chunk, i: int, due: float) -> None:
        """Frame ``i`` of the push chunk being paced; the next one a frame period later."""
        sent = await self._send_frame(chunk, i)
        more = sent and i + 1 < len(chunk.frames) and self._paced is not None and self._paced[0] is chunk
        if more:
            self._paced = (chunk, i + 1, due + chunk.pts_step_us / 1e6)
        elif self._paced is not None and self._paced[0] is chunk:
            self._paced = None

    async def _send_chunk(self, chunk: Chunk) -> None:
        """Every frame of a pull or replayed chunk, at once."""
        for i in range(len(chunk.frames)):
            if not await self._send_frame(chunk, i):
                return

    async def _send_frame(self, chunk: Chunk, i: int) -> bool:
        """Encode and send ``chunk.frames[i]`` (a ``skipped`` first, before a late block's
        first frame); False when the rest of the chunk is stale (re-attached or closing)."""
        enc = self._encoder
        if enc is None or chunk.session_id != self.sid:
            return False
        if i == 0 and chunk.late_frames:  # late: the client kept showing the last one
            await self.ws.send_bytes(Skipped(chunk.block_idx, self._last_block, chunk.late_frames).encode())
        frame = chunk.frames[i]
        index = chunk.first_frame + i
        asked, self._keyframe = self._keyframe, False  # a request made meanwhile stays
        if enc.offload:  # on the codec pool; this task alone uses ``enc``, one frame at a time
            data, key, seconds = await self.codecs.run(_timed_encode, enc, frame, index, asked)
            if enc is not self._encoder or self._closing is not None:
                return False  # re-attached or closing meanwhile: the rest of this chunk is stale
        else:
            data, key, seconds = _timed_encode(enc, frame, index, asked)
        self.metrics.encode_latency.labels(enc.codec).observe(seconds)
        if asked and not key:
            self._keyframe = True
        h, w = frame.shape[:2]
        now = time.time()
        msg = Frame(
            chunk.session_id, chunk.block_idx, index, chunk.frame_pts(i),
            chunk.action_seq, enc.codec, w, h, data, key, chunk.t_gen, now,
        )
        await self.ws.send_bytes(msg.encode())
        self.frames_sent += 1
        self._last_block = chunk.block_idx
        self._last_frame = (chunk.action_seq, index)
        self._sent_window.append(time.monotonic())
        self.metrics.frames_sent.labels(enc.codec).inc()
        self.metrics.bytes_sent.labels(enc.codec).inc(len(data))
        self.metrics.frame_latency.labels(enc.codec).observe(max(0.0, now - chunk.t_gen))
        if self._start_at is not None:
            self.metrics.ttff.observe(time.monotonic() - self._start_at)
            self._start_at = None
        return True

    async def _status_loop(self) -> None:
        interval = self.settings.status_interval_s
        try:
            while True:
                await asyncio.sleep(interval)
                if self.sid is not None and self._closing is None:
                    status = self._make_status(interval)
                    if status is not None:
                        self._status = status.encode()
                        self._wake.set()
        except asyncio.CancelledError:
            pass

    def _make_status(self, interval: float) -> Status | None:
        live = self.service.live(self.sid or "")
        if live is None:
            return None
        now = time.monotonic()
        sent = sum(1 for t in self._sent_window if now - t <= interval)
        s = live.settings
        recipe, timesteps = self.service.shape.schedule(s.steps)
        action_seq, frame = self._last_frame or (None, None)
        return Status(
            live.level, sent / interval, s.fps, self.queued, self.drops,
            live.skipped, live.misses, s.bucket, s.steps, s.lookahead,
            round(self.service.utilisation(), 4), action_seq, frame, recipe, timesteps,
        )

    def _abort(self) -> None:
        transport = self.request.transport
        if transport is not None:
            transport.abort()


def _timed_encode(enc: FrameEncoder, frame: np.ndarray, index: int, key: bool) -> tuple[bytes, bool, float]:
    """``enc.encode`` and the seconds it took (on whichever thread runs it)."""
    t0 = time.perf_counter()
    data, is_key = enc.encode(frame, index, key=key)
    return data, is_key, time.perf_counter() - t0


async def websocket_handler(request: web.Request) -> web.StreamResponse:
    from worldserve.server.keys import CLOSABLES, CODECS, METRICS, SERVICE, SETTINGS

    app = request.app
    settings = app[SETTINGS]
    origin = request.headers.get("Origin")
    if settings.allowed_origins and origin is not None and origin not in settings.allowed_origins:
        # a page from another site would open sessions with its visitor's cookies or address
        return web.json_response({"error": "forbidden_origin", "message": f"origin {origin!r} is not allowed"},
                                 status=403)
    ws = web.WebSocketResponse(
        max_msg_size=settings.max_msg_size,
        heartbeat=settings.heartbeat_s,
        compress=False,
    )
    await ws.prepare(request)
    conn = Connection(ws, request, app[SERVICE], settings, app[METRICS], app[CODECS])
    app[CLOSABLES].add(conn)
    try:
        await conn.run()
    finally:
        app[CLOSABLES].discard(conn)
    return ws
