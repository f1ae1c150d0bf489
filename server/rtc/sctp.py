"""A cap on what a peer may make the server hold of one data-channel message.

aiortc (1.16) reassembles each SCTP message from its fragments in memory and enforces no
inbound size: a peer that ignores the receive window can send one message as large as it
likes, and the server keeps every fragment until the last one comes. aiortc has no public
hook for it, so ``cap_inbound`` wraps this association's DATA chunk handler: after each
chunk, a stream whose unfinished message holds more than ``max_bytes`` has its fragments
dropped and ``on_over`` is called once (the peer then sends a ``too_big`` error and closes
the connection). A message that does complete is checked again when it is read
(``RtcPeer._decode``). Where aiortc's internals are not the ones this was written against,
nothing is wrapped and the read-time check is what remains (logged once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("worldserve.rtc")


def cap_inbound(sctp: Any, max_bytes: int, on_over: Callable[[int], None]) -> bool:
    """Hold ``sctp`` (an ``RTCSctpTransport``) to ``max_bytes`` per unfinished inbound
    message; ``on_over(bytes held)`` is called the first time one goes over. False where
    aiortc's internals are not there to wrap."""
    inner = getattr(sctp, "_receive_data_chunk", None)
    streams = getattr(sctp, "_inbound_streams", None)
    if inner is None or not isinstance(streams, dict):
        log.warning("aiortc has no _receive_data_chunk/_inbound_streams: inbound data-channel messages "
                    "are checked for size only once complete")
        return False
    tripped = False

    async def receive(chunk: Any) -> None:
        nonlocal tripped
        await inner(chunk)
        stream = streams.get(chunk.stream_id)
        pending = getattr(stream, "reassembly", None)
        if not pending:
            return
        held = sum(len(c.user_data) for c in pending)
        if held > max_bytes:
            pending.clear()  # the fragments go; the stream never completes that message
            if not tripped:
                tripped = True
                on_over(held)

    sctp._receive_data_chunk = receive
    return True
