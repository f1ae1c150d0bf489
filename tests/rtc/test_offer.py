"""POST /v1/rtc/offer, the data channels and the peer's lifetime, on the fake runner."""

from __future__ import annotations

from typing import Any

import aiohttp
import msgpack
import pytest

from tests.polling import until
from tests.rtc.harness import serve_rtc
from worldserve.bench._rtc_client import OfferRefused, RtcClient
from worldserve.protocol import (
    Action,
    Block,
    Ended,
    Error,
    Keyframe,
    Ping,
    Pong,
    Prompt,
    Resumed,
    Start,
    Started,
    Status,
)
from worldserve.server.keys import AGENT, METRICS, SERVICE
from worldserve.server.prompt_filter import Blocklist, PromptChecks
from worldserve.server.rtc import RtcSettings
from worldserve.server.rtc.keys import RTC_PEERS

START = {"prompt": "a green forest", "fps": 24.0, "bucket": 64}


async def post(url: str, body: Any, **kw: Any) -> tuple[int, dict[str, Any], aiohttp.typedefs.LooseHeaders]:
    async with aiohttp.ClientSession() as http, http.post(f"{url}/v1/rtc/offer", **({"json": body} | kw)) as r:
        return r.status, await r.json(), r.headers


async def offer_sdp() -> str:
    """A real offer (video recvonly + data channels) from an aiortc peer."""
    from aiortc import RTCConfiguration, RTCPeerConnection

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")
    pc.createDataChannel("control")
    await pc.setLocalDescription(await pc.createOffer())
    sdp: str = pc.localDescription.sdp
    await pc.close()
    return sdp


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({"type": "offer"}, 400, "bad_message", "sdp"),
        ({"type": "answer", "sdp": "v=0"}, 400, "bad_message", "sdp"),
        ({"type": "offer", "sdp": "x"}, 400, "bad_message", "start"),
        ({"type": "offer", "sdp": "x", "start": START, "resume": {}}, 400, "bad_message", "start"),
        ({"type": "offer", "sdp": "x", "start": {**START, "fps": 0}}, 400, "bad_message", "start.fps"),
        ({"type": "offer", "sdp": "x", "start": {**START, "mode": "pull"}}, 400, "wrong_mode", "start.mode"),
        ({"type": "offer", "sdp": "x", "start": {**START, "seed": "7"}}, 400, "bad_message", "start.seed"),
        ({"type": "offer", "sdp": "x", "resume": {"session_id": "../x", "token": "t"}}, 400, "bad_message",
         "resume.session_id"),
        ({"type": "offer", "sdp": "not an sdp", "start": START}, 400, "bad_message", "sdp"),
    ],
)
async def test_bad_offers_get_a_clear_error_naming_the_field(
    body: dict[str, Any], status: int, code: str, field: str
) -> None:
    async with serve_rtc() as (app, url):
        got, data, _ = await post(url, body)
        assert (got, data["error"], data.get("field")) == (status, code, field), data
        assert data["message"]
        assert not app[RTC_PEERS] and len(app[SERVICE].store) == 0


async def test_a_body_that_is_not_json_or_too_big_is_refused() -> None:
    async with serve_rtc(rtc=RtcSettings(max_offer_bytes=4096)) as (_, url):
        got, data, _ = await post(url, None, data=b"{nope")
        assert (got, data["error"]) == (400, "bad_message")
        got, data, _ = await post(url, {"type": "offer", "sdp": "x" * 5000, "start": START})
        assert (got, data["error"]) == (413, "too_big")


async def test_an_offer_without_video_or_data_channels_is_refused() -> None:
    from aiortc import RTCConfiguration, RTCPeerConnection

    async with serve_rtc() as (app, url):
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.createDataChannel("control")
        await pc.setLocalDescription(await pc.createOffer())
        got, data, _ = await post(url, {"type": "offer", "sdp": pc.localDescription.sdp, "start": START})
        await pc.close()
        assert (got, data["error"]) == (400, "bad_message") and "video" in data["message"]
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("video", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        got, data, _ = await post(url, {"type": "offer", "sdp": pc.localDescription.sdp, "start": START})
        await pc.close()
        assert (got, data["error"]) == (400, "bad_message") and "data channels" in data["message"]
        assert not app[RTC_PEERS] and len(app[SERVICE].store) == 0


async def test_an_api_key_is_required_when_the_server_has_some() -> None:
    async with serve_rtc(api_keys=frozenset({"sesame"})) as (_, url):
        sdp = await offer_sdp()
        got, data, _ = await post(url, {"type": "offer", "sdp": sdp, "start": START})
        assert (got, data["error"], data["field"]) == (401, "unauthorized", "api_key")
        got, data, _ = await post(url, {"type": "offer", "sdp": sdp, "start": START, "api_key": "nope"})
        assert got == 401
        got, data, _ = await post(url, {"type": "offer", "sdp": sdp, "start": START},
                                  headers={"Authorization": "Bearer nope"})
        assert got == 401
        async with RtcClient(url) as c:  # in start, as on the WebSocket
            answer = await c.connect(start={**START, "api_key": "sesame"})
            assert answer["session"]["type"] == "started"
            await c.close()
        async with RtcClient(url) as c:
            answer = await c.connect(start=START, api_key="sesame")
            assert answer["session"]["type"] == "started"
            await c.close()


async def test_a_full_server_answers_503_with_retry_after() -> None:
    async with serve_rtc(capacity=1) as (_, url):
        async with RtcClient(url) as first:
            await first.connect(start=START)
            with pytest.raises(OfferRefused) as refused:
                async with RtcClient(url) as second:
                    await second.connect(start=START)
            assert refused.value.status == 503
            assert refused.value.body["error"] == "at_capacity"
            assert refused.value.body["retry_after"] > 0
            await first.close()


async def test_resume_refuses_a_bad_token_and_an_unknown_session() -> None:
    async with serve_rtc() as (_, url):
        async with RtcClient(url) as c:
            answer = await c.connect(start=START)
            sid = answer["session"]["session_id"]
            with pytest.raises(OfferRefused) as bad:
                async with RtcClient(url) as thief:
                    await thief.connect(resume={"session_id": sid, "token": "wrong"})
            assert (bad.value.status, bad.value.body["error"]) == (403, "bad_token")
            with pytest.raises(OfferRefused) as missing:
                async with RtcClient(url) as lost:
                    await lost.connect(resume={"session_id": "no-such-session", "token": "t"})
            assert (missing.value.status, missing.value.body["error"]) == (404, "missing_session_state")
            await c.close()


async def test_disabled_webrtc_answers_404_so_clients_fall_back() -> None:
    async with serve_rtc(rtc=RtcSettings(enabled=False)) as (_, url):
        got, data, _ = await post(url, {"type": "offer", "sdp": await offer_sdp(), "start": START})
        assert (got, data["error"]) == (404, "rtc_disabled")


async def test_video_flows_and_control_carries_protocol_v1_messages() -> None:
    async with serve_rtc() as (app, url):
        async with RtcClient(url) as c:
            answer = await c.connect(start=START)
            assert answer["type"] == "answer" and answer["codec"] == "H264"
            assert "a=candidate" in answer["sdp"]  # non-trickle: every candidate in the answer
            started, _ = await c.message(Started)
            assert started.session_id == answer["session"]["session_id"]
            _, frame = await c.next_frame()
            assert (frame.width, frame.height) == (64, 64)
            c.send(Ping(7))
            pong, _ = await c.message(Pong)
            assert isinstance(pong, Pong) and pong.id == 7
            c.send(Keyframe())
            c.send(Start())  # the offer opened the session
            err, _ = await c.message(Error)
            assert isinstance(err, Error) and err.code == "already_started"
            c.send(Block(1))
            err, _ = await c.message(Error)
            assert isinstance(err, Error) and err.code == "wrong_mode"
            assert c.control is not None
            c.control.send("text")
            err, _ = await c.message(Error)
            assert isinstance(err, Error) and err.code == "bad_message"
            c.control.send(b"\xc1")
            err, _ = await c.message(Error)
            assert isinstance(err, Error) and err.code == "bad_message"
            assert c.actions is not None
            c.actions.send(Ping(1).encode())  # actions only on the actions channel
            err, _ = await c.message(Error)
            assert isinstance(err, Error) and "actions channel" in err.message
            seq = c.action(["forward"])
            status, wire = await c.message(Status, 5)
            while wire.get("action_seq") != seq:
                status, wire = await c.message(Status, 5)
            assert isinstance(status, Status) and status.target_fps == 24.0 and wire["frame"] >= 0
            await c.close()
        await until(lambda: not app[RTC_PEERS] and len(app[SERVICE].store) == 0)


async def test_actions_and_control_messages_share_the_protocol_with_the_websocket() -> None:
    """An action works on either channel and stale seqs are dropped, as on the WebSocket."""
    async with serve_rtc() as (app, url):
        async with RtcClient(url) as c:
            answer = await c.connect(start=START)
            sid = answer["session"]["session_id"]
            await c.next_frame()
            c.send(Action(5, ("left",)))
            await until(lambda: app[SERVICE].live(sid).action_seq == 5)  # type: ignore[union-attr]
            assert c.actions is not None
            c.actions.send(Action(3, ("right",)).encode())  # stale: dropped
            c.actions.send(Action(6, ("right",)).encode())
            await until(lambda: app[SERVICE].live(sid).action_seq == 6)  # type: ignore[union-attr]
            await c.close()


async def test_a_blocked_prompt_is_refused_at_the_offer_and_on_the_control_channel() -> None:
    """The prompt filter (server/prompt_filter.py) screens a WebRTC start before any session
    or model time, and a switch on the control channel as on the WebSocket."""
    async with serve_rtc(prompt_checks=PromptChecks(Blocklist.parse("dragon\nre:^burn"))) as (app, url):
        for prompt in ("a Dragon in the sky", "burning fields"):
            got, data, _ = await post(url, {"type": "offer", "sdp": await offer_sdp(),
                                            "start": {**START, "prompt": prompt}})
            assert (got, data["error"], data.get("field")) == (422, "prompt_refused", "prompt"), data
            assert "blocklist line" in data["message"]
            assert not app[RTC_PEERS] and len(app[SERVICE].store) == 0
        async with RtcClient(url) as c:
            answer = await c.connect(start=START)
            sid = answer["session"]["session_id"]
            await c.next_frame()
            c.send(Prompt("a dragon", id=4))
            err, _ = await c.message(Error)
            assert isinstance(err, Error) and err.code == "prompt_refused" and not err.fatal
            assert app[SERVICE].live(sid).session.scene == START["prompt"]  # type: ignore[union-attr]
            await c.next_frame()  # still streaming
            c.send(Prompt("a quiet lake", id=5))
            await until(lambda: app[SERVICE].live(sid).session.scene == "a quiet lake")  # type: ignore[union-attr]
            await c.close()
        assert app[METRICS].prompts_refused.labels("start")._value.get() == 2
        assert app[METRICS].prompts_refused.labels("switch")._value.get() == 1


async def test_the_newest_action_of_a_burst_over_the_message_rate_reaches_the_session() -> None:
    """Over the message rate the data channel drops messages, but never the newest action."""
    async with serve_rtc(max_msgs_per_s=50.0, msg_burst=20) as (app, url):
        async with RtcClient(url) as c:
            answer = await c.connect(start=START)
            sid = answer["session"]["session_id"]
            await c.next_frame()
            assert c.actions is not None
            for seq in range(1, 301):  # far over 20 at once
                c.actions.send(Action(seq, ("left",) if seq % 2 else ("right",)).encode())
            await until(lambda: app[SERVICE].live(sid).action_seq == 300)  # type: ignore[union-attr]
            await c.close()


async def test_closing_the_peer_connection_detaches_and_an_offer_resumes_it() -> None:
    async with serve_rtc() as (app, url):
        service = app[SERVICE]
        c = RtcClient(url)
        answer = await c.connect(start=START)
        sid, token = answer["session"]["session_id"], answer["session"]["token"]
        for _ in range(5):
            await c.next_frame()
        await c.close(send_close=False)  # a dropped connection, not the end of the session
        await until(lambda: not app[RTC_PEERS])
        await until(lambda: getattr(service.live(sid), "suspension", None) is not None)
        assert service.store.detached_count == 1
        async with RtcClient(url) as again:
            answer = await again.connect(resume={"session_id": sid, "token": token})
            assert answer["session"]["type"] == "resumed"
            assert answer["session"]["session_id"] == sid and answer["session"]["block_idx"] > 0
            resumed, _ = await again.message(Resumed)
            assert isinstance(resumed, Resumed)
            await again.next_frame()
            assert service.store.active_count == 1
            await again.close()
        await until(lambda: len(service.store) == 0)


async def test_a_second_peer_resuming_takes_the_session_over() -> None:
    async with serve_rtc() as (app, url):
        first = RtcClient(url)
        answer = await first.connect(start=START)
        sid, token = answer["session"]["session_id"], answer["session"]["token"]
        await first.next_frame()
        async with RtcClient(url) as second:
            await second.connect(resume={"session_id": sid, "token": token})
            ended, _ = await first.message(Ended)
            assert isinstance(ended, Ended) and ended.reason == "replaced"
            await second.next_frame()
            await until(lambda: len(app[RTC_PEERS]) == 1)
            await second.close()
        await first.close(send_close=False)


async def test_deleting_the_session_tells_the_peer_and_closes_it() -> None:
    async with serve_rtc() as (app, url):
        async with RtcClient(url) as c:
            answer = await c.connect(start=START)
            await c.next_frame()
            async with aiohttp.ClientSession() as http:
                r = await http.delete(f"{url}/v1/sessions/{answer['session']['session_id']}",
                                      headers={"X-Session-Token": answer["session"]["token"]})
                assert r.status == 200
            ended, _ = await c.message(Ended)
            assert isinstance(ended, Ended) and ended.reason == "deleted"
            await until(lambda: not app[RTC_PEERS])


async def test_a_peer_that_never_connects_is_dropped_and_its_session_detached() -> None:
    async with serve_rtc(rtc=RtcSettings(connect_timeout_s=0.3)) as (app, url):
        got, data, _ = await post(url, {"type": "offer", "sdp": await offer_sdp(), "start": START})
        assert got == 200
        await until(lambda: not app[RTC_PEERS])
        sid = data["session"]["session_id"]
        await until(lambda: app[SERVICE].store.detached_count == 1)
        assert app[SERVICE].live(sid) is not None


async def test_shutdown_ends_sessions_and_closes_peers() -> None:
    async with serve_rtc() as (app, url):
        c = RtcClient(url)
        await c.connect(start=START)
        await c.next_frame()
        peers = set(app[RTC_PEERS])
        assert len(peers) == 1
    # serve_rtc closed the server: on_shutdown ended the session, cleanup closed the peer
    assert not app[RTC_PEERS] and all(p.closed for p in peers)
    ended = [m for _, m, _ in c.messages if isinstance(m, Ended)]
    assert ended and ended[0].reason == "shutdown"
    await c.close(send_close=False)


async def test_the_browser_client_is_served() -> None:
    async with serve_rtc() as (_, url), aiohttp.ClientSession() as http:
        async with http.get(f"{url}/") as r:
            assert r.status == 200 and r.content_type == "text/html"
            assert "/web/app.js" in await r.text()
        for name, ctype in (("app.js", "text/javascript"), ("msgpack.js", "text/javascript"),
                            ("style.css", "text/css")):
            async with http.get(f"{url}/web/{name}") as r:
                assert r.status == 200 and r.content_type == ctype, name
        for bad in ("..%2Fserver%2Fapp.py", ".hidden", "nope.js", "index.py"):
            async with http.get(f"{url}/web/{bad}") as r:
                assert r.status == 404, bad


def test_status_extra_keys_do_not_break_a_v1_decoder() -> None:
    from worldserve.protocol import decode_server

    wire = Status(0, 24.0, 24.0, 0, 0, 0, 0, 64, 4, 1, 0.1).to_wire()
    wire.update(action_seq=3, frame=17)
    assert isinstance(decode_server(msgpack.packb(wire, use_bin_type=True)), Status)


async def test_vp8_when_it_is_the_only_codec_offered() -> None:
    async with serve_rtc(rtc=RtcSettings(codecs=("VP8",))) as (_, url):
        async with RtcClient(url) as c:
            answer = await c.connect(start=START)
            assert answer["codec"] == "VP8"
            _, frame = await c.next_frame()
            assert (frame.width, frame.height) == (64, 64)
            await c.close()


async def test_metrics_count_peers_offers_and_frames() -> None:
    async with serve_rtc() as (_, url):
        async with RtcClient(url) as c:
            await c.connect(start=START)
            for _ in range(3):
                await c.next_frame()
            async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as r:
                text = await r.text()
            await c.close()
    assert "worldserve_webrtc_peers 1.0" in text
    assert 'worldserve_webrtc_offers_total{result="ok"} 1.0' in text
    assert 'worldserve_webrtc_connects_total{result="ok"} 1.0' in text
    assert 'worldserve_webrtc_frames_sent_total{codec="h264"}' in text


async def test_a_migrate_goes_out_on_control_before_ended() -> None:
    from worldserve.protocol import Migrate

    async with serve_rtc() as (app, url):
        async with RtcClient(url) as c:
            answer = await c.connect(start=START)
            sid = answer["session"]["session_id"]
            await c.next_frame()
            app[AGENT].migration.migrated(sid, Migrate(sid, "ws://10.0.0.2:8000/v1/ws", 42, "w2"))
            migrate, _ = await c.message(Migrate)
            assert isinstance(migrate, Migrate) and migrate.block_idx == 42
            ended, _ = await c.message(Ended)
            assert isinstance(ended, Ended) and ended.reason == "migrated"
            await until(lambda: not app[RTC_PEERS])


async def test_offers_are_allowed_from_any_origin() -> None:
    async with serve_rtc() as (_, url), aiohttp.ClientSession() as http:
        async with http.options(f"{url}/v1/rtc/offer", headers={
            "Origin": "http://other:8000", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"}) as r:
            assert r.status == 204
            assert r.headers["Access-Control-Allow-Origin"] == "*"
            assert "POST" in r.headers["Access-Control-Allow-Methods"]
        got, _, headers = await post(url, {"type": "offer"})
        assert got == 400 and headers["Access-Control-Allow-Origin"] == "*"


def _count_peer_connections(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one each time the offer handler builds a peer connection."""
    from worldserve.server.rtc import offer

    built: list[int] = []
    real = offer.RTCPeerConnection

    def counting(*a: Any, **kw: Any) -> Any:
        built.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(offer, "RTCPeerConnection", counting)
    return built


async def test_a_resume_with_a_wrong_token_builds_no_peer_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    async with serve_rtc() as (_, url):
        async with RtcClient(url) as c:
            answer = await c.connect(start=START)
            sid = answer["session"]["session_id"]
            built = _count_peer_connections(monkeypatch)
            for _ in range(3):
                with pytest.raises(OfferRefused) as bad:
                    async with RtcClient(url) as thief:
                        await thief.connect(resume={"session_id": sid, "token": "wrong"})
                assert (bad.value.status, bad.value.body["error"]) == (403, "bad_token")
            assert built == []
            await c.close()


async def test_control_messages_waiting_behind_a_slow_one_are_bounded() -> None:
    import asyncio

    from worldserve.protocol import Error, Ping

    async with serve_rtc(control_queue=4) as (app, url):
        async with RtcClient(url) as c:
            await c.connect(start=START)
            (peer,) = app[RTC_PEERS]
            async with peer._control_order:  # as if an observation were decoding
                waiting = [asyncio.create_task(peer._on_control(Ping(i).encode())) for i in range(7)]
                await until(lambda: peer._waiting == 4, what="four waiting")
                err, _ = await c.message(Error)
                assert isinstance(err, Error) and err.code == "rate_limited"
            await asyncio.gather(*waiting)
            assert peer._waiting == 0
            await c.close()


async def test_a_start_over_its_client_s_quota_builds_no_peer_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    async with serve_rtc(quota_start_burst=1, quota_starts_per_s=0.01) as (_, url):
        async with RtcClient(url) as c:
            await c.connect(start=START)
            built = _count_peer_connections(monkeypatch)
            with pytest.raises(OfferRefused) as over:
                async with RtcClient(url) as again:
                    await again.connect(start=START)
            assert (over.value.status, over.value.body["error"]) == (429, "over_quota")
            assert built == []
            await c.close()


async def test_a_data_channel_message_over_the_cap_gets_too_big_and_closes_the_connection() -> None:
    from worldserve.server.rtc.peer import RtcPeer

    too_big: list[int] = []
    real = RtcPeer.too_big

    def counted(self: RtcPeer, size: int) -> None:
        too_big.append(size)
        real(self, size)

    async with serve_rtc(max_msg_size=4096) as (app, url):
        RtcPeer.too_big = counted  # type: ignore[method-assign]
        try:
            async with RtcClient(url) as c:
                await c.connect(start=START)
                assert c.control is not None
                c.control.send(b"\x00" * 100_000)  # arrives in fragments: held no further than the cap
                err, _ = await c.message(Error)
                assert isinstance(err, Error) and err.code == "too_big" and err.fatal
                await until(lambda: not app[RTC_PEERS], what="the connection closed")
                assert too_big and too_big[0] <= 4096 + 2048  # tripped while reassembling, not once whole
        finally:
            RtcPeer.too_big = real  # type: ignore[method-assign]


async def test_the_inbound_cap_drops_an_unfinished_message_s_fragments() -> None:
    from aiortc.rtcsctptransport import (
        SCTP_DATA_FIRST_FRAG,
        SCTP_DATA_LAST_FRAG,
        DataChunk,
        InboundStream,
    )

    from worldserve.server.rtc.sctp import cap_inbound

    class Sctp:  # aiortc's reassembly, as RTCSctpTransport runs it
        def __init__(self) -> None:
            self._inbound_streams: dict[int, InboundStream] = {}
            self.delivered: list[bytes] = []

        async def _receive_data_chunk(self, chunk: DataChunk) -> None:
            stream = self._inbound_streams.setdefault(chunk.stream_id, InboundStream())
            stream.add_chunk(chunk)
            self.delivered += [m[2] for m in stream.pop_messages()]

    def chunk(tsn: int, seq: int, data: bytes, flags: int = 0) -> DataChunk:
        c = DataChunk(flags=flags)
        c.tsn, c.stream_id, c.stream_seq, c.protocol, c.user_data = tsn, 1, seq, 53, data
        return c

    sctp, over = Sctp(), []
    assert cap_inbound(sctp, 2048, over.append)
    await sctp._receive_data_chunk(chunk(1, 0, b"a" * 1000, SCTP_DATA_FIRST_FRAG | SCTP_DATA_LAST_FRAG))
    assert sctp.delivered == [b"a" * 1000] and over == []  # under the cap: as before
    for i in range(3):
        await sctp._receive_data_chunk(chunk(2 + i, 1, b"b" * 1000, SCTP_DATA_FIRST_FRAG if i == 0 else 0))
    assert over == [3000] and not sctp._inbound_streams[1].reassembly


async def test_an_offer_that_forks_a_world_is_refused_naming_the_field() -> None:
    async with serve_rtc() as (app, url):
        body = {"type": "offer", "sdp": await offer_sdp(), "start": {**START, "world": "w-a-saved-world"}}
        got, data, _ = await post(url, body)
        assert (got, data["error"], data.get("field")) == (400, "bad_message", "world"), data
        assert "WebSocket" in data["message"] and len(app[SERVICE].store) == 0
