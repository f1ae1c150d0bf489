"""The WebRTC transport: one ``RtcPeer`` per peer connection, one session on it.

The session is opened (or resumed) by the HTTP offer (server/rtc/offer.py); from then on
the peer is the session's ``service.Peer``, as a WebSocket ``Connection`` would be:

- video: ``chunk`` puts each finished chunk into the track's one-slot holder
  (server/rtc/track.py); aiortc pulls, encodes (server/rtc/encoder.py) and sends.
- ``actions`` data channel (the client opens it unordered, ``maxRetransmits: 0``): ``action``
  messages only; a late or lost one is simply superseded by the next (the service drops
  stale seqs). The server never sends on it.
- ``control`` data channel (reliable, ordered): every other message of protocol v1
  (protocol/codec.py), msgpack, the same bytes as on the WebSocket. Client: prompt,
  observation, keyframe, ping, close (and action). Server: started/resumed first, then
  ack, status, degradation, skipped, error, ended, pong. ``start``/``resume``/``block``
  are refused (the offer opened the session; WebRTC sessions are push mode).
  Messages wait in a bounded deque until the channel is open or while more than
  ``control_buffer_bytes`` sit in SCTP (oldest dropped past ``control_queue``); status is
  latest-wins.

Client messages from both channels reach the service through server/dispatch.py, as on
the WebSocket (the same rate limit, decoding and routing); errors are answered here.

Status messages name the last frame sent (``status.action_seq`` and ``status.frame``,
declared in protocol/messages.py; here the last frame the track handed to the encoder,
nil before the first). Besides every ``status_interval_s``, a status goes out as soon as a
frame with a newer ``action_seq`` is sent (and for the first frame), queued like any
control message, so a client can measure action-to-frame latency: the first frame it
shows after that status is the one (video frames carry no metadata a browser can read).
The first such status also anchors frame indices: it names the first frame sent, and
the receiver's timestamps count on from it at 90 kHz.

Closing: the client's ``close`` message ends the session for good; a peer connection
that closes or fails (or never connects within ``connect_timeout_s``) detaches the
session, resumable with its token for ``detached_ttl_s``; either way the track, the
encoder and the peer connection are released. A drain hands the session to another
worker: ``migrate`` and ``ended: migrated`` go out on control (``end``), then the peer
closes with no session left here; the client re-offers to the target with ``resume``
(server/rtc/offer.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress

from aiortc import RTCDataChannel, RTCPeerConnection

from worldserve.protocol import (
    Action,
    Block,
    ClientMessage,
    CloseCode,
    Degradation,
    Ended,
    Error,
    ErrorCode,
    ProtocolError,
    Resume,
    Resumed,
    ServerMessage,
    Skipped,
    Start,
    Started,
    Status,
    error_from,
)
from worldserve.server.dispatch import Inbound, dispatch
from worldserve.server.metrics import Metrics
from worldserve.server.rtc.encoder import LatencyEncoder
from worldserve.server.rtc.metrics import RtcMetrics
from worldserve.server.rtc.track import SessionVideoTrack
from worldserve.server.service import Chunk, Service
from worldserve.server.settings import RtcSettings, Settings
from worldserve.session.errors import SessionError

log = logging.getLogger("worldserve.rtc")

CONTROL = "control"
ACTIONS = "actions"


class RtcPeer:
    """One peer connection and the session attached to it (implements ``service.Peer``,
    ``dispatch.Transport`` and ``keys.Closable``)."""

    def __init__(
        self,
        pc: RTCPeerConnection,
        track: SessionVideoTrack,
        encoder: LatencyEncoder | None,
        service: Service,
        settings: Settings,
        rtc: RtcSettings,
        metrics: Metrics,
        rtc_metrics: RtcMetrics,
        *,
        on_closed: Callable[[RtcPeer], None] | None = None,
    ) -> None:
        self.pc = pc
        self.track = track
        self.encoder = encoder  # None: aiortc's own (this aiortc had no slot for ours)
        self.codec = encoder.codec.lower() if encoder is not None else "default"
        self.service = service
        self.settings = settings
        self.rtc = rtc
        self.metrics = metrics
        self.rtc_metrics = rtc_metrics
        self.sid: str | None = None
        self._on_closed = on_closed
        self._control: RTCDataChannel | None = None
        self._queue: deque[bytes] = deque()
        self._waiting = 0  # control messages received, not yet handled (at most control_queue)
        self._status: bytes | None = None  # the newest status (latest wins)
        self._inbound = Inbound(settings, metrics)
        self._control_order = asyncio.Lock()  # control messages handled one by one, in order
        self._sent_window: deque[float] = deque(maxlen=512)  # frame send times (fps)
        self._reported_seq = -1  # action_seq of the last status sent for a new action
        self._last_put = -1  # the newest block handed to the track (what the client keeps showing)
        self._last_frame: tuple[int, int] | None = None  # (action_seq, index) last sent
        self._created = time.monotonic()
        self._first_frame = True
        self._encoded_seen = (0, 0.0, 0)  # encoder frames, seconds, bytes already counted
        self._tasks: list[asyncio.Task[None]] = []
        self._closing: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._shutting = False
        self.control_drops = 0
        rtc_metrics.peers.inc()
        track.on_frame = self._frame_sent
        track.on_drop = metrics.drops.labels("slow_client").inc
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_state)

    # --- lifecycle ---

    def start(self) -> None:
        """Start the status loop and the connect deadline (after the answer is set)."""
        self._tasks.append(asyncio.create_task(self._status_loop(), name="rtc-status"))
        self._tasks.append(asyncio.create_task(self._connect_deadline(), name="rtc-connect"))

    async def close(self, code: int = CloseCode.GOING_AWAY, reason: str = "shutdown") -> None:
        """Close from the server side (shutdown): flush control messages (``ended``) for
        up to ``close_flush_s``, then close; a session still attached is detached."""
        await self._drain(self.rtc.close_flush_s)
        await self._shutdown(reason)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def wait_closed(self) -> None:
        """Until the peer has released everything (its ``on_closed`` has run)."""
        await self._closed.wait()

    # --- service.Peer (never waits) ---

    def attached(self, reply: Started | Resumed, quality: int) -> None:
        self.sid, self._last_put = reply.session_id, -1
        self.track.set_rate(reply.fps)
        self.request_keyframe()
        self.send(reply)

    def send(self, msg: ServerMessage) -> None:
        if isinstance(msg, Degradation):
            self.track.set_rate(msg.fps)
        self._queue_control(msg.encode())

    def chunk(self, chunk: Chunk, *, ordered: bool) -> None:
        # Video is latest-wins even for replayed blocks: a stale picture is worth nothing.
        if self._closing is None and chunk.session_id == self.sid:
            if chunk.late_frames:  # late (push): said on control right before it, as on the WebSocket
                self._queue_control(Skipped(chunk.block_idx, self._last_put, chunk.late_frames).encode())
            self._last_put = chunk.block_idx
            self.track.put(chunk)

    def end(self, ended: Ended, code: int) -> None:
        """The session ended: tell the client, then close the peer connection."""
        if ended.session_id == self.sid:
            self.sid = None
        self._queue_control(ended.encode())
        if self._closing is None:
            self._closing = asyncio.create_task(self._close_after_flush(ended.reason))

    # --- data channels ---

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label == CONTROL:
            self._control = channel
            channel.bufferedAmountLowThreshold = self.rtc.control_buffer_bytes // 2
            channel.on("message", self._on_control)
            channel.on("open", self._flush)
            channel.on("bufferedamountlow", self._flush)
            self._flush()
        elif channel.label == ACTIONS:
            channel.on("message", self._on_action)
        else:
            log.info("closing unknown data channel %r", channel.label, extra={"sid": self.sid})
            channel.close()

    async def _on_action(self, data: bytes | str) -> None:
        msg = self._decode(data)
        if msg is None:
            return
        if not isinstance(msg, Action):
            self._error(ProtocolError(
                f"the actions channel carries only action messages, got {msg.TYPE!r}; "
                "send it on the control channel", "type"))
            return
        await self._dispatch(msg)  # an action never waits

    async def _on_control(self, data: bytes | str) -> None:
        # aiortc runs each handler call as a task, in arrival order; an observation waits
        # for its image to decode off the loop, and the FIFO lock keeps the ones behind it
        # behind it.
        msg = self._decode(data)
        if msg is None:
            return
        if self._waiting >= self.settings.control_queue:  # behind a slow one: bounded, not queued forever
            self._error(ProtocolError(f"over {self.settings.control_queue} control messages wait; this one "
                                      "was dropped", code=ErrorCode.RATE_LIMITED))
            return
        self._waiting += 1
        try:
            async with self._control_order:
                await self._dispatch(msg)
        finally:
            self._waiting -= 1

    def _decode(self, data: bytes | str) -> ClientMessage | None:
        if not isinstance(data, bytes):
            self._error(ProtocolError("text messages are not accepted: send binary msgpack"))
            return None
        if len(data) > self.settings.max_msg_size:
            self.too_big(len(data))
            return None
        if not self._inbound.admit(self._send_error):
            # over the rate: dropped, unless it is an action (the newest controls win)
            return self._inbound.over_rate_action(data)
        try:
            return self._inbound.decode(data)
        except ProtocolError as exc:
            self._error(exc)
            return None

    def too_big(self, size: int) -> None:
        """A data-channel message over ``max_msg_size`` (read whole, or still arriving:
        server/rtc/sctp.py): a fatal ``too_big`` error, then the connection closes (the
        session detaches, as on the WebSocket's 1009)."""
        self._send_error(Error(ErrorCode.TOO_BIG, f"a data-channel message of {size} bytes or more is over "
                                                  f"{self.settings.max_msg_size}; closing", fatal=True))
        if self._closing is None:
            self._closing = asyncio.create_task(self._close_after_flush("too_big"))

    async def _dispatch(self, msg: ClientMessage) -> None:
        if self._closing is not None:  # the session ended: controls that crossed that are not read
            return
        try:
            if isinstance(msg, Start | Resume):
                raise ProtocolError(
                    "on WebRTC the offer opens or resumes the session; this connection has "
                    f"session {self.sid}", "type", ErrorCode.ALREADY_STARTED)
            elif isinstance(msg, Block):
                raise ProtocolError(
                    "WebRTC sessions are push mode; use the WebSocket for pull mode",
                    "block_idx", ErrorCode.WRONG_MODE)
            else:
                await dispatch(self.service, self, msg)
        except (ProtocolError, SessionError) as exc:
            self._error(exc)
        except Exception:
            log.exception("control handler failed", extra={"sid": self.sid})
            self._send_error(Error(ErrorCode.INTERNAL, "internal server error", fatal=True))
            if self._closing is None:
                self._closing = asyncio.create_task(self._close_after_flush("internal"))

    # --- dispatch.Transport (and ``send`` above) ---

    def need_session(self) -> str:
        if self.sid is None:
            raise ProtocolError("this connection has no session (it ended)", "type", ErrorCode.NOT_STARTED)
        return self.sid

    def request_keyframe(self) -> None:
        if self.encoder is not None:
            self.encoder.request_keyframe()
        else:  # aiortc's own encoder: its sender's request (as on a PLI)
            for t in self.pc.getTransceivers():
                with suppress(AttributeError):
                    t.sender._send_keyframe()

    # --- control sending ---

    def _error(self, exc: Exception) -> None:
        self._send_error(error_from(exc))

    def _send_error(self, err: Error) -> None:
        self.metrics.errors.labels(err.code).inc()
        self.send(err)

    def _queue_control(self, data: bytes) -> None:
        if len(self._queue) >= self.settings.control_queue:
            self._queue.popleft()
            self.control_drops += 1
        self._queue.append(data)
        self._flush()

    def _flush(self) -> None:
        ch = self._control
        if ch is None or ch.readyState != "open":
            return
        limit = self.rtc.control_buffer_bytes
        try:
            while self._queue and ch.bufferedAmount < limit:
                ch.send(self._queue.popleft())
            if self._status is not None and not self._queue and ch.bufferedAmount < limit:
                data, self._status = self._status, None
                ch.send(data)
        except Exception as exc:  # the channel closed under us
            log.info("control send failed: %s", exc, extra={"sid": self.sid})

    # --- status ---

    def _frame_sent(self, chunk: Chunk, index: int) -> None:
        """The track hands a frame to the encoder (called inside its recv)."""
        now = time.monotonic()
        self._sent_window.append(now)
        self.rtc_metrics.frames_sent.labels(self.codec).inc()
        self.metrics.frame_latency.labels(f"rtc_{self.codec}").observe(max(0.0, time.time() - chunk.t_gen))
        if self._first_frame:
            self._first_frame = False
            self.metrics.ttff.observe(now - self._created)
        self._last_frame = (chunk.action_seq, index)
        if chunk.action_seq != self._reported_seq:  # the first frame, or a newer action
            self._reported_seq = chunk.action_seq
            data = self._status_bytes()
            if data is not None:
                self._queue_control(data)  # queued, not latest-wins: none of these is lost

    def _queue_status(self) -> None:
        self._status = self._status_bytes()
        self._flush()

    def _status_bytes(self) -> bytes | None:
        status = self._make_status()
        if status is None:
            return None
        return status.encode()

    def _make_status(self) -> Status | None:
        live = self.service.live(self.sid or "")
        if live is None:
            return None
        interval = self.settings.status_interval_s
        now = time.monotonic()
        sent = sum(1 for t in self._sent_window if now - t <= interval)
        s = live.settings
        recipe, timesteps = self.service.shape.schedule(s.steps)
        action_seq, frame = self._last_frame or (None, None)
        return Status(
            live.level, sent / interval, s.fps, self.track.queued,
            self.track.dropped, live.skipped, live.misses, s.bucket,
            s.steps, s.lookahead, round(self.service.utilisation(), 4), action_seq, frame, recipe, timesteps,
        )

    async def _status_loop(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.settings.status_interval_s)
                self._count_encodes()
                if self.sid is not None and self._closing is None:
                    self._queue_status()
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("status loop failed", extra={"sid": self.sid})

    def _count_encodes(self) -> None:
        enc = self.encoder
        if enc is None:
            return
        frames, seconds, nbytes = enc.frames, enc.seconds, enc.bytes
        f0, s0, b0 = self._encoded_seen
        if frames > f0:
            self.rtc_metrics.encode_seconds.labels(self.codec).observe((seconds - s0) / (frames - f0))
            self.rtc_metrics.bytes_sent.labels(self.codec).inc(nbytes - b0)
        self._encoded_seen = (frames, seconds, nbytes)

    # --- closing ---

    async def _connect_deadline(self) -> None:
        try:
            await asyncio.sleep(self.rtc.connect_timeout_s)
        except asyncio.CancelledError:
            return
        if self.pc.connectionState != "connected":
            log.info("peer did not connect in %.1f s", self.rtc.connect_timeout_s, extra={"sid": self.sid})
            self.rtc_metrics.connects.labels("timeout").inc()
            self._begin_shutdown("connect_timeout")

    def _on_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected":
            self.rtc_metrics.connects.labels("ok").inc()
            self.rtc_metrics.connect_seconds.observe(time.monotonic() - self._created)
            for t in self._tasks:
                if t.get_name() == "rtc-connect":
                    t.cancel()
        elif state in ("failed", "closed"):
            if state == "failed":
                self.rtc_metrics.connects.labels("failed").inc()
            self._begin_shutdown(state)

    def _begin_shutdown(self, reason: str) -> None:
        if self._closing is None:
            self._closing = asyncio.create_task(self._shutdown(reason))

    async def _close_after_flush(self, reason: str) -> None:
        await self._drain(self.rtc.close_flush_s)  # let ``ended`` leave
        await self._shutdown(reason)

    async def _drain(self, timeout: float) -> None:
        """Wait until queued control messages have been handed to SCTP (or ``timeout``)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self._flush()
            ch = self._control
            if ch is None or ch.readyState != "open" or (not self._queue and ch.bufferedAmount == 0):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.02)  # and for the packets to leave

    async def _shutdown(self, reason: str) -> None:
        """Detach the session (if any) and release everything; idempotent."""
        if self._closed.is_set():
            return
        if self._shutting:
            await self._closed.wait()
            return
        self._shutting = True
        try:
            me = asyncio.current_task()
            for t in self._tasks:
                if t is not me:
                    t.cancel()
            for t in self._tasks:
                if t is not me:
                    with suppress(asyncio.CancelledError):
                        await t
            self._count_encodes()
            sid = self.sid
            if sid is not None:
                self.sid = None
                try:
                    await self.service.disconnected(sid, self)
                except Exception:
                    log.exception("detaching the session failed", extra={"sid": sid})
            self.track.stop()
            with suppress(Exception):
                await self.pc.close()
            if self.encoder is not None:
                self.encoder.close()
            log.info("peer closed", extra={"sid": sid, "reason": reason})
        finally:
            self.rtc_metrics.peers.dec()
            self._closed.set()
            if self._on_closed is not None:
                self._on_closed(self)
