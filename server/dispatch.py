"""Client messages to the service: what every transport does the same way.

The WebSocket (``server/ws.py``) and the WebRTC data channels (``server/rtc/peer.py``)
read client messages of protocol v1 the same way and hand them to the same ``Service``:

- ``Inbound`` admits each message under the connection's rate limit (over it, the message
  is dropped and a ``rate_limited`` error goes out at most once a second), decodes and
  validates it (``ProtocolError`` for a bad one) and counts it.
- ``dispatch`` routes a message that acts on the connection's session (action, prompt,
  observation, block: to the service's ``Inputs``; keyframe; close: to the service) or
  needs none (ping), and sends the answer (``ack``, ``pong``) through the transport.

What differs stays with each transport: how a session is opened (``start`` and ``resume``
are WebSocket messages; on WebRTC the HTTP offer opens the session), the messages it
refuses (WebRTC sessions are push mode: no ``block``), the text of its ``not_started``
error, and how it answers a failure (which errors close the connection, with which code).
A transport calls ``dispatch`` inside its own error handling: every exception raised here
(``ProtocolError``, the session layer's errors) is the transport's to turn into an
``error`` reply.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from worldserve.protocol import (
    Action,
    Block,
    ClientMessage,
    Close,
    Error,
    ErrorCode,
    Keyframe,
    Observation,
    Ping,
    Pong,
    Prompt,
    ProtocolError,
    Save,
    ServerMessage,
    decode_client,
)
from worldserve.server.limits import TokenBucket
from worldserve.server.metrics import Metrics
from worldserve.server.service import Service
from worldserve.server.settings import Settings

# Over the message rate, messages up to this size are still read for an action (an action
# is well under 100 bytes); bigger ones are dropped unread.
OVER_RATE_ACTION_BYTES = 512


class Transport(Protocol):
    """What ``dispatch`` needs of a connection (``ws.Connection``, ``rtc.peer.RtcPeer``)."""

    def send(self, msg: ServerMessage) -> None:
        """Queue a message to the client (never waits)."""
        ...

    def need_session(self) -> str:
        """The id of the session on this connection; ``ProtocolError`` (``not_started``)
        when there is none."""
        ...

    def request_keyframe(self) -> None:
        """Make the next frame sent a keyframe."""
        ...


class Inbound:
    """One connection's inbound messages: rate limit, decode, count."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self._clock = clock
        self._bucket = TokenBucket(settings.max_msgs_per_s, settings.msg_burst, clock)
        self._last_limit_error = float("-inf")

    def admit(self, send_error: Callable[[Error], None]) -> bool:
        """Spend one message's token. False when over the rate: drop the message; at most
        once a second ``send_error`` gets a ``rate_limited`` error saying so."""
        if self._bucket.take():
            return True
        now = self._clock()
        if now - self._last_limit_error >= 1.0:  # at most one such error a second
            self._last_limit_error = now
            send_error(
                Error(
                    ErrorCode.RATE_LIMITED,
                    "too many messages; some were dropped",
                    retry_after=self._bucket.wait_time(),
                )
            )
        return False

    def over_rate_action(self, data: bytes) -> Action | None:
        """A message that ``admit`` refused: the action in it, if it is a small, valid
        action (the newest controls must reach the session whatever the rate; the caller
        coalesces it like any other), else None and it is dropped unread or quietly (the
        client was told it is over the rate)."""
        if len(data) > OVER_RATE_ACTION_BYTES:
            return None
        try:
            msg = decode_client(data)
        except ProtocolError:
            return None
        return msg if isinstance(msg, Action) else None

    def decode(self, data: bytes) -> ClientMessage:
        """Decode and validate one client message and count it; ``ProtocolError`` if it
        cannot be used."""
        msg = decode_client(data)
        self.metrics.messages.labels(msg.TYPE).inc()
        return msg


async def dispatch(service: Service, transport: Transport, msg: ClientMessage) -> None:
    """Hand one decoded client message to the service for the transport's session.

    ``start`` and ``resume`` are the transport's own (it handles or refuses them before
    calling this); any other message type is a ``ProtocolError``. Errors propagate. Only an
    observation (its image is decoded off the loop) and a prompt (the prompt filter's check
    runs off the loop) wait; a transport that awaits each call in turn keeps its client's
    messages in order.
    """
    inputs = service.inputs  # the part that owns a session's inputs (server/inputs.py)
    live = service.live(transport.need_session()) if not isinstance(msg, Ping) else None
    if live is not None:
        live.heard_at = service.clock()  # not idle (Settings.idle_timeout_s)
    if isinstance(msg, Action):
        inputs.action(transport.need_session(), msg)
    elif isinstance(msg, Prompt):
        transport.send(await inputs.prompt(transport.need_session(), msg))
    elif isinstance(msg, Observation):
        transport.send(await inputs.observe(transport.need_session(), msg))
    elif isinstance(msg, Block):
        await inputs.block(transport.need_session(), msg)
    elif isinstance(msg, Keyframe):
        transport.need_session()
        transport.request_keyframe()
    elif isinstance(msg, Ping):
        transport.send(Pong(msg.id, time.time()))
    elif isinstance(msg, Close):
        service.close(transport.need_session(), "client_close")
    elif isinstance(msg, Save):  # the WebSocket's (server/ws.py); a WebRTC session saves over HTTP
        raise ProtocolError(f"save over HTTP here: POST /v1/sessions/{transport.need_session()}/save", "type")
    else:  # decode_client returns only these, start and resume
        raise ProtocolError(f"unhandled message {type(msg).__name__}", "type")
