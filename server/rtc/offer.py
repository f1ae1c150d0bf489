"""``POST /v1/rtc/offer``: SDP offer in, SDP answer out (non-trickle), session opened.

Request (JSON)::

    {"type": "offer", "sdp": "<the client's offer, ICE gathering complete>",
     "start": {"prompt": "a snowy forest", "seed": 0, "fps": 24, "bucket": 64,
               "lookahead": 1},                       # protocol v1 ``start`` fields
     "api_key": "..."}                                # when the server requires one
    # or, to resume a detached session (after a dropped connection):
    {"type": "offer", "sdp": "...",
     "resume": {"session_id": "...", "token": "..."}}

``start`` and ``resume`` are validated exactly as the WebSocket messages are (same
fields, same ranges, same errors); ``mode`` must be ``push``. ``resume.block_idx`` may be
left out: video frames carry no block numbers a browser could see, so the session goes
on at the first block it has not generated (generation pauses while detached: nothing is
skipped; a session this worker adopts from the directory goes on at its handoff's
block); 0 starts a new epoch, as on the WebSocket. The offer must have a video
m-line the client receives (``recvonly``) and an SCTP m-line (the ``control`` and
``actions`` data channels, which the client creates).

Migration (several workers): when its worker drains, the session's ``control`` channel
gets ``migrate {url, session_id, block_idx: K}`` and ``ended: migrated``, then the peer
connection closes. The client offers again to the target, at the http(s) origin of
``url`` (``ws://host:port/v1/ws`` -> ``http://host:port/v1/rtc/offer``; any origin may
post), with ``"resume": {"session_id", "token", "block_idx": K}``; the target adopts the
handoff and answers ``resumed`` (``restored_from: K``, ``gap_blocks: 0``). A ``url`` of
``""`` means no worker had room: ask the router (``POST /v1/resume``) after
``retry_after``. A resume at a worker that does not hold the session is 409
``session_moved``.

Answer 200::

    {"type": "answer", "sdp": "...", "codec": "H264",
     "session": {"type": "started", "session_id": ..., "token": ..., ...}}

``session`` is the ``started`` (or ``resumed``) message as a map; the same message is
also the first one on the control channel. Errors are JSON ``{"error": code, "message",
"field", "retry_after"}``: 400 bad offer or field, 401 API key, 403 bad token or no
reservation (``placement_required``), 404 missing session state, 409 stale block or
state or a session held by another worker, 413 too big, 422 a prompt the prompt filter
refused (``prompt_refused``: server/prompt_filter.py), 503 at capacity, not ready
(draining included) or directory unavailable (with ``Retry-After``).

Order of work: a cheap readiness check; the peer connection with the track's
transceiver and its codec preferences added BEFORE ``setRemoteDescription`` (aiortc 1.16
ignores preferences set later); the remote offer; the session opened or resumed (so a
full server refuses before any media flows); the answer, with our encoder installed into
the sender and ICE gathering complete (aiortc's ``setLocalDescription`` gathers fully).
Anything that fails after the session opened closes the peer, which detaches it.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from typing import Any

from aiohttp import web
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import SessionDescription

from worldserve.protocol import (
    MAX_BLOCK_IDX,
    ErrorCode,
    ProtocolError,
    Resume,
    Resumed,
    Start,
    Started,
    from_wire,
)
from worldserve.server.auth import authorized, presented_key
from worldserve.server.keys import CLOSABLES, METRICS, SERVICE, SETTINGS
from worldserve.server.quotas import OverQuota, clients
from worldserve.server.remote import DirectoryUnavailable, PlacementRequired
from worldserve.server.rtc.encoder import (
    BitratePolicy,
    LatencyEncoder,
    codec_name,
    codec_preferences,
    install_encoder,
)
from worldserve.server.rtc.ice import add_loopback_candidates, rtc_configuration, wants_loopback
from worldserve.server.rtc.keys import RTC_METRICS, RTC_PEERS, RTC_SETTINGS
from worldserve.server.rtc.peer import RtcPeer
from worldserve.server.rtc.sctp import cap_inbound
from worldserve.server.rtc.track import SessionVideoTrack
from worldserve.server.service import NotReady, Service
from worldserve.server.settings import VideoCodecName
from worldserve.server.ws import DIRECTORY_DOWN
from worldserve.session.errors import AtCapacity, BadToken, SessionError, SessionStateMissing

log = logging.getLogger("worldserve.rtc")

_STATUS: dict[str, int] = {  # error code -> HTTP status
    ErrorCode.BAD_MESSAGE: 400,
    ErrorCode.UNSUPPORTED_VERSION: 400,
    ErrorCode.WRONG_MODE: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.BAD_TOKEN: 403,
    ErrorCode.MISSING_SESSION_STATE: 404,
    ErrorCode.STALE_BLOCK: 409,
    ErrorCode.ILLEGAL_TRANSITION: 409,
    ErrorCode.SESSION_MOVED: 409,
    ErrorCode.TOO_BIG: 413,
    ErrorCode.PROMPT_REFUSED: 422,
    "rtc_disabled": 404,
    ErrorCode.PLACEMENT_REQUIRED: 403,
    ErrorCode.AT_CAPACITY: 503,
    ErrorCode.OVER_QUOTA: 429,
    ErrorCode.NOT_READY: 503,
    ErrorCode.DIRECTORY_UNAVAILABLE: 503,
}


LATEST = MAX_BLOCK_IDX  # a resume's block_idx placeholder: go on where generation paused


class OfferError(Exception):
    def __init__(self, code: str, message: str, *, field: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code = str(code)
        self.message = message
        self.field = field
        self.retry_after = retry_after

    def response(self) -> web.Response:
        body: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        headers = {}
        if self.retry_after is not None:
            body["retry_after"] = self.retry_after
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        return web.json_response(body, status=_STATUS.get(self.code, 500), headers=headers)


# Any origin may post an offer: a page served by a router opens its session here, and
# one served by another worker resumes it here after a migration. Nothing rides on
# cookies (the resume token is in the body).
_CORS = {"Access-Control-Allow-Origin": "*"}


async def offer_handler(request: web.Request) -> web.Response:
    metrics = request.app[RTC_METRICS]
    try:
        resp = await _offer(request)
    except OfferError as exc:
        metrics.offers.labels(exc.code).inc()
        request.app[METRICS].errors.labels(exc.code).inc()
        log.info("offer refused: %s: %s", exc.code, exc.message)
        resp = exc.response()
    else:
        metrics.offers.labels("ok").inc()
    resp.headers.update(_CORS)
    return resp


async def offer_preflight(request: web.Request) -> web.Response:
    return web.Response(status=204, headers={
        **_CORS,
        "Access-Control-Allow-Methods": "POST",
        "Access-Control-Allow-Headers": "Content-Type, Authorization",
        "Access-Control-Max-Age": "600",
    })


async def _offer(request: web.Request) -> web.Response:
    app = request.app
    settings, rtc, service = app[SETTINGS], app[RTC_SETTINGS], app[SERVICE]
    if not rtc.enabled:
        raise OfferError("rtc_disabled", "WebRTC is disabled on this server; use /v1/ws")
    body = await _read_body(request, rtc.max_offer_bytes)
    sdp = body.get("sdp")
    if body.get("type") != "offer" or not isinstance(sdp, str) or not sdp:
        raise OfferError(ErrorCode.BAD_MESSAGE, "need type 'offer' and a non-empty sdp", field="sdp")
    start, resume = _session_request(body)
    if start is not None:
        _authorize(request, start.api_key, settings.api_keys)
    ok, why = service.readiness()
    if not ok and (start is not None or not why.startswith("full")):
        retry = 1.0 if why.startswith("warming") else settings.admission_retry_after_s
        code = ErrorCode.AT_CAPACITY if why == "full" else ErrorCode.NOT_READY
        raise OfferError(code, f"server is {why}; retry after {retry:g} s", retry_after=retry)

    if resume is not None:  # a wrong token costs no peer connection (certificate, SDP parse)
        await _open_session(service, None, resume, None)
    who = clients(request.remote, presented_key(request.headers, start.api_key)) if start else ()
    try:  # nor does a client over its quota
        service.quotas.check(who, lambda sid: sid in service.table)
    except OverQuota as exc:
        raise OfferError(ErrorCode.OVER_QUOTA, str(exc), retry_after=exc.retry_after_s) from None
    fps = service.shape.rate(start.fps if start is not None else None)  # a resume's: set from its reply
    pc = RTCPeerConnection(rtc_configuration(rtc))
    track = SessionVideoTrack(fps)
    transceiver = pc.addTransceiver(track, direction="sendonly")
    transceiver.setCodecPreferences(codec_preferences(rtc.codecs))
    peer = RtcPeer(pc, track, None, service, settings, rtc, app[METRICS], app[RTC_METRICS],
                   on_closed=lambda p: _forget(app, p))
    app[RTC_PEERS].add(peer)
    opened = False
    try:
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp, "offer"))
        except Exception as exc:
            raise OfferError(ErrorCode.BAD_MESSAGE, f"bad offer: {exc}", field="sdp") from None
        if transceiver.mid is None:
            raise OfferError(ErrorCode.BAD_MESSAGE, "the offer has no video m-line to receive on",
                             field="sdp")
        if pc.sctp is None:
            raise OfferError(ErrorCode.BAD_MESSAGE,
                             "the offer has no data channels (create 'control' and 'actions')",
                             field="sdp")
        cap_inbound(pc.sctp, settings.max_msg_size, peer.too_big)  # aiortc enforces no inbound size
        if wants_loopback(rtc.loopback_candidates):
            add_loopback_candidates(pc)
        answer = await pc.createAnswer()
        codec = _video_codec(answer.sdp)
        if codec is not None:
            enc = LatencyEncoder(codec, fps=fps, policy=BitratePolicy.from_settings(rtc),
                                 keyframe_interval_s=rtc.keyframe_interval_s)
            if install_encoder(transceiver.sender, enc):
                peer.encoder, peer.codec = enc, codec.lower()
        reply = await _open_session(service, start, resume, peer, who)
        assert reply is not None
        opened = True
        await pc.setLocalDescription(answer)  # gathers every candidate (non-trickle)
        local = pc.localDescription
        peer.start()
        app[CLOSABLES].add(peer)
    except OfferError:
        await peer.close()
        raise
    except Exception:
        log.exception("offer failed", extra={"sid": peer.sid})
        await peer.close()
        if opened:
            raise OfferError(ErrorCode.INTERNAL, "internal error setting up the connection") from None
        raise
    log.info("rtc peer", extra={"sid": reply.session_id, "codec": codec or "default",
                                "resumed": resume is not None})
    return web.json_response({
        "type": local.type,
        "sdp": local.sdp,
        "codec": codec,
        "session": _json_safe(reply.to_wire()),
    })


async def _read_body(request: web.Request, limit: int) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > limit:
        raise OfferError(ErrorCode.TOO_BIG, f"offer body over {limit} bytes")
    raw = bytearray()
    while len(raw) <= limit:  # read() returns what has arrived: loop to the end
        chunk = await request.content.read(limit + 1 - len(raw))
        if not chunk:
            break
        raw += chunk
    if len(raw) > limit:
        raise OfferError(ErrorCode.TOO_BIG, f"offer body over {limit} bytes")
    try:
        body = json.loads(bytes(raw))
    except ValueError as exc:
        raise OfferError(ErrorCode.BAD_MESSAGE, f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise OfferError(ErrorCode.BAD_MESSAGE, "body must be a JSON object")
    return body


def _session_request(body: dict[str, Any]) -> tuple[Start | None, Resume | None]:
    """The ``start`` or ``resume`` of the body, checked as protocol v1 messages (a resume
    without ``block_idx`` gets ``LATEST``)."""
    has_start, has_resume = "start" in body, "resume" in body
    if has_start == has_resume:
        raise OfferError(ErrorCode.BAD_MESSAGE, "give exactly one of start or resume", field="start")
    key = "start" if has_start else "resume"
    fields = body[key]
    if not isinstance(fields, dict):
        raise OfferError(ErrorCode.BAD_MESSAGE, f"{key} must be an object", field=key)
    try:
        if has_start:
            msg = from_wire(Start, {"api_key": body.get("api_key"), **fields})
        else:
            msg = from_wire(Resume, {"block_idx": LATEST, **fields})
    except ProtocolError as exc:
        raise OfferError(exc.code, exc.reason, field=f"{key}.{exc.field}" if exc.field else key) from None
    if isinstance(msg, Start):
        if msg.mode != "push":
            raise OfferError(ErrorCode.WRONG_MODE,
                             "WebRTC sessions are push mode; use the WebSocket for pull mode",
                             field="start.mode")
        return msg, None
    assert isinstance(msg, Resume)
    return None, msg


def _authorize(request: web.Request, key: str | None, keys: frozenset[str]) -> None:
    """The key from the body (``api_key``, top level or in ``start``) or the header."""
    if not authorized(request.headers, keys, key):
        raise OfferError(ErrorCode.UNAUTHORIZED,
                         "an API key is required to start a session (api_key field or "
                         "Authorization: Bearer header)", field="api_key")


async def _open_session(
    service: Service, start: Start | None, resume: Resume | None, peer: RtcPeer | None, who: tuple[str, ...] = ()
) -> Started | Resumed | None:
    """Start or resume the session on ``peer``; with no peer, only check a resume's token
    (before a peer connection is built for it)."""
    try:
        if peer is None:
            assert resume is not None
            await service.authorize(resume)
            return None
        if start is not None:
            if start.world is not None:
                raise ProtocolError("a saved world is forked over the WebSocket (start with world)", "world")
            return await service.start(start, peer, who)  # reservation and directory checks apply
        assert resume is not None
        if resume.block_idx == LATEST:
            resume = replace(resume, block_idx=await _next_block(service, resume.session_id))
        return await service.resume(resume, peer)
    except NotReady as exc:
        raise OfferError(ErrorCode.NOT_READY, str(exc), retry_after=exc.retry_after) from None
    except DirectoryUnavailable as exc:  # multi-worker: refuse rather than misplace
        log.warning("directory unavailable: %s", exc)
        raise OfferError(ErrorCode.DIRECTORY_UNAVAILABLE, DIRECTORY_DOWN, retry_after=1.0) from None
    except PlacementRequired as exc:
        raise OfferError(exc.code, str(exc)) from None
    except AtCapacity as exc:
        raise OfferError(ErrorCode.AT_CAPACITY, str(exc), retry_after=exc.retry_after_s) from None
    except OverQuota as exc:
        raise OfferError(ErrorCode.OVER_QUOTA, str(exc), retry_after=exc.retry_after_s) from None
    except ProtocolError as exc:
        raise OfferError(exc.code, exc.reason, field=exc.field) from None
    except (BadToken, SessionStateMissing, SessionError) as exc:
        raise OfferError(exc.code, str(exc)) from None


async def _next_block(service: Service, sid: str) -> int:
    """The first block the session has not generated (where a resume goes on)."""
    live = service.live(sid)
    if live is None:
        # Not held here. With several workers it may be placed here with a handoff (a
        # migration's target, or a re-placement after a crash): it goes on at the
        # handoff's block. Else 1, not 0 (a new epoch): resume() answers
        # missing_session_state. fetch raises as resume() would (session_moved, ...).
        handoff = await service.remote.fetch(sid) if service.remote is not None else None
        return handoff.next_block if handoff is not None else 1
    if live.suspension is not None:
        return live.suspension.next_block
    return live.next_block  # still attached elsewhere or suspending: resume() waits


def _video_codec(sdp: str) -> VideoCodecName | None:
    """The codec the answer sends video with (its first video payload type)."""
    for media in SessionDescription.parse(sdp).media:
        if media.kind == "video" and media.rtp.codecs:
            return codec_name(media.rtp.codecs[0].mimeType)
    return None


def _json_safe(wire: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in wire.items() if not isinstance(v, bytes)}


def _forget(app: web.Application, peer: RtcPeer) -> None:
    app[RTC_PEERS].discard(peer)
    app[CLOSABLES].discard(peer)
