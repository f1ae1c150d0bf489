"""The WebSocket protocol against a server with the fake runner (fast, deterministic frames)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import msgpack
import numpy as np

from tests.polling import until
from tests.server.harness import fake_factory, frames, recv, recv_type, send, serve
from worldserve.protocol import (
    Ack,
    Action,
    Block,
    Close,
    CloseCode,
    Ended,
    Error,
    Frame,
    Image,
    Keyframe,
    Observation,
    Ping,
    Pong,
    Prompt,
    Resume,
    Resumed,
    Start,
    Started,
    Status,
    decode_server,
)
from worldserve.session.fake_runner import decode_frame, session_tag


async def start(ws: aiohttp.ClientWebSocketResponse, **kw: object) -> Started:
    await send(ws, Start(**kw))  # type: ignore[arg-type]
    msg = await recv(ws)
    assert isinstance(msg, Started), msg
    return msg


async def closed(ws: aiohttp.ClientWebSocketResponse, timeout: float = 10.0) -> int | None:
    """Read until the socket closes; its close code."""
    while True:
        msg = await ws.receive(timeout=timeout)
        if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
            return ws.close_code


async def test_push_session_streams_consecutive_blocks_of_its_own_frames() -> None:
    async with serve() as s:
        ws = await s.connect()
        st = await start(ws, prompt="forest", fps=50.0, codec="raw", bucket=64)
        assert (st.width, st.height, st.chunk_frames, st.protocol) == (64, 64, 1, 1)
        got = await frames(ws, 20)
        assert [f.block_idx for f in got] == list(range(20))
        for f in got:
            img = np.frombuffer(f.data, np.uint8).reshape(f.height, f.width, 3)
            assert decode_frame(img) == (f.block_idx, session_tag(st.session_id))
        assert all(f.frame == f.block_idx and f.key for f in got)
        assert got[-1].pts_us == int(19 * 1e6 / 50.0)


async def test_pull_mode_returns_exactly_the_blocks_asked_for_in_order() -> None:
    async with serve() as s:
        ws = await s.connect()
        await start(ws, mode="pull", codec="raw")
        first = await frames(ws, 1)  # start asks for block 0
        for n in range(1, 6):
            await send(ws, Block(n))
        rest = await frames(ws, 5)
        assert [f.block_idx for f in first + rest] == [0, 1, 2, 3, 4, 5]
        # nothing unasked arrives
        try:
            extra = await recv(ws, timeout=0.3)
        except TimeoutError:
            extra = None
        assert extra is None or not isinstance(extra, Frame)


async def test_pull_retransmit_of_the_last_block_resends_it_and_a_gap_is_stale() -> None:
    async with serve() as s:
        ws = await s.connect()
        await start(ws, mode="pull", codec="raw")
        await send(ws, Block(1))
        got = await frames(ws, 2)
        await send(ws, Block(1))  # retransmit
        again = await frames(ws, 1)
        assert again[0].block_idx == 1 and again[0].data == got[1].data
        await send(ws, Block(5))
        err = await recv_type(ws, Error)
        assert isinstance(err, Error) and err.code == "stale_block" and not err.fatal
        await send(ws, Block(2))
        assert (await frames(ws, 1))[0].block_idx == 2  # the session goes on


async def test_block_0_in_pull_mode_starts_a_new_epoch() -> None:
    async with serve() as s:
        ws = await s.connect()
        await start(ws, mode="pull", codec="raw")
        await send(ws, Block(1))
        await frames(ws, 2)
        await send(ws, Block(0))
        await send(ws, Block(1))
        got = await frames(ws, 2)
        assert [f.block_idx for f in got] == [0, 1]
        [session] = list(s.service.store)
        assert session.epoch == 1


async def test_a_block_request_in_push_mode_is_refused_as_wrong_mode() -> None:
    async with serve() as s:
        ws = await s.connect()
        await start(ws, fps=30.0)
        await send(ws, Block(1))
        err = await recv_type(ws, Error)
        assert isinstance(err, Error) and err.code == "wrong_mode" and err.field == "block_idx"


async def test_too_many_outstanding_pull_requests_are_refused() -> None:
    async with serve(pull_queue=2) as s:
        ws = await s.connect()
        await start(ws, mode="pull", codec="raw", fps=1.0)
        await frames(ws, 1)
        runner = s.service.engine.runner  # type: ignore[union-attr]
        runner.sleep = lambda _seconds: time.sleep(0.2)  # type: ignore[attr-defined]
        for n in (1, 2, 3):
            await send(ws, Block(n))
        err = await recv_type(ws, Error)
        assert isinstance(err, Error) and err.code == "rate_limited"


async def test_prompt_and_observation_are_acked_with_their_ids() -> None:
    async with serve() as s:
        ws = await s.connect()
        await start(ws, fps=20.0)
        await send(ws, Prompt("a snowy forest at night", id=41))
        ack = await recv_type(ws, Ack)
        assert ack == Ack("prompt", 41)
        img = Image.from_array(np.full((32, 48, 3), 200, np.uint8), "png")
        await send(ws, Observation(img, id=42))
        assert await recv_type(ws, Ack) == Ack("observation", 42)
        await send(ws, Ping(9))
        pong = await recv_type(ws, Pong)
        assert isinstance(pong, Pong) and pong.id == 9


async def test_frames_report_the_newest_applied_action_seq() -> None:
    async with serve() as s:
        ws = await s.connect()
        await start(ws, fps=50.0, lookahead=0)
        await frames(ws, 2)
        for seq in (1, 2, 3):
            await send(ws, Action(seq, ("forward",), (0.5, -0.5)))
        seen = 0
        for f in await frames(ws, 15):
            assert f.action_seq >= seen
            seen = f.action_seq
        assert seen == 3


async def test_actions_beyond_the_rate_cap_coalesce_to_the_latest() -> None:
    async with serve(max_actions_per_s=5.0, action_burst=1) as s:
        ws = await s.connect()
        await start(ws, fps=50.0, lookahead=0)
        for seq in range(1, 41):
            await send(ws, Action(seq, ("left",)))
        got = await frames(ws, 30)
        assert got[-1].action_seq == 40  # the newest won; nothing errored
        metrics = s.service.metrics.render().decode()
        assert 'worldserve_actions_total{result="coalesced"}' in metrics


async def test_status_messages_arrive_periodically() -> None:
    async with serve(status_interval_s=0.2) as s:
        ws = await s.connect()
        await start(ws, fps=30.0)
        status = await recv_type(ws, Status, timeout=5.0)
        assert isinstance(status, Status) and status.target_fps == 30.0 and status.bucket == 64


async def test_messages_before_start_get_not_started_and_a_second_start_already_started() -> None:
    async with serve() as s:
        ws = await s.connect()
        await send(ws, Action(1))
        err = await recv(ws)
        assert isinstance(err, Error) and err.code == "not_started" and not err.fatal
        await start(ws)
        await send(ws, Start())
        err2 = await recv_type(ws, Error)
        assert isinstance(err2, Error) and err2.code == "already_started"


async def test_bad_messages_get_errors_naming_the_field_and_the_session_goes_on() -> None:
    async with serve() as s:
        ws = await s.connect()
        await start(ws, fps=50.0)
        bad = [
            b"\xc1garbage",
            msgpack.packb({"type": "action", "v": 1, "seq": "one"}),
            msgpack.packb({"type": "action", "v": 1, "seq": 5, "keys": ["jump"]}),
            msgpack.packb({"type": "warp", "v": 1}),
            msgpack.packb({"type": "prompt", "v": 2, "prompt": "x"}),
            msgpack.packb([1, 2, 3]),
        ]
        for data in bad:
            await ws.send_bytes(data)
        await ws.send_str("hello")
        errors = []
        while len(errors) < len(bad) + 1:
            msg = await recv(ws)
            if isinstance(msg, Error):
                errors.append(msg)
        assert [e.code for e in errors] == [
            "bad_message", "bad_message", "bad_message", "bad_message", "unsupported_version",
            "bad_message", "bad_message",
        ]
        assert errors[1].field == "seq" and errors[2].field == "keys" and errors[3].field == "type"
        assert not any(e.fatal for e in errors)
        assert len(await frames(ws, 5)) == 5


async def test_unsupported_bucket_is_refused_with_the_served_ones() -> None:
    async with serve(buckets=(64,)) as s:
        ws = await s.connect()
        await send(ws, Start(bucket=128))
        err = await recv(ws)
        assert isinstance(err, Error) and err.field == "bucket" and "64" in err.message


async def test_resume_after_a_dropped_connection_continues_at_the_next_block() -> None:
    async with serve() as s:
        ws = await s.connect()
        st = await start(ws, fps=40.0, codec="raw")
        got = await frames(ws, 12)
        await ws.close()  # dropped: no close message
        await until(lambda: s.service.store.detached_count == 1, what="the session detached")
        ws2 = await s.connect()
        await send(ws2, Resume(st.session_id, st.token, got[-1].block_idx + 1))
        resumed = await recv(ws2)
        assert isinstance(resumed, Resumed) and resumed.block_idx == 12
        more = await frames(ws2, 10)
        assert [f.block_idx for f in got + more] == list(range(22))
        for f in more:
            img = np.frombuffer(f.data, np.uint8).reshape(f.height, f.width, 3)
            assert decode_frame(img)[0] == f.block_idx  # the model state continued too


async def test_resume_of_an_unknown_session_is_missing_session_state() -> None:
    async with serve() as s:
        ws = await s.connect()
        await send(ws, Resume("nosuchsession", "token", 5))
        err = await recv(ws)
        assert isinstance(err, Error) and err.code == "missing_session_state"
        assert "block_idx 5" in err.message


async def test_resume_with_a_wrong_token_is_refused_and_closed_1008() -> None:
    async with serve() as s:
        ws = await s.connect()
        st = await start(ws, fps=20.0)
        await ws.close()
        await until(lambda: s.service.store.detached_count == 1, what="the session detached")
        ws2 = await s.connect()
        await send(ws2, Resume(st.session_id, "x" * 32, 1))
        err = await recv(ws2)
        assert isinstance(err, Error) and err.code == "bad_token" and err.fatal
        assert await closed(ws2) == CloseCode.POLICY
        assert s.service.store.detached_count == 1  # still resumable with the right token


async def test_resume_at_a_block_that_is_gone_is_stale_and_the_session_stays_resumable() -> None:
    async with serve(replay_blocks=2) as s:
        ws = await s.connect()
        st = await start(ws, fps=50.0)
        await frames(ws, 10)
        await ws.close()
        await until(lambda: s.service.store.detached_count == 1, what="the session detached")
        ws2 = await s.connect()
        await send(ws2, Resume(st.session_id, st.token, 1))
        err = await recv(ws2)
        assert isinstance(err, Error) and err.code == "stale_block"
        await send(ws2, Resume(st.session_id, st.token, 0))  # block 0: a new epoch
        resumed = await recv(ws2)
        assert isinstance(resumed, Resumed) and resumed.epoch == 1 and resumed.block_idx == 0
        assert (await frames(ws2, 1))[0].block_idx == 0


async def test_a_resume_takes_the_session_over_from_a_stale_connection() -> None:
    async with serve() as s:
        ws = await s.connect()
        st = await start(ws, fps=40.0)
        got = await frames(ws, 3)
        ws2 = await s.connect()
        await send(ws2, Resume(st.session_id, st.token, got[-1].block_idx + 1))
        ended = await recv_type(ws, Ended)
        assert isinstance(ended, Ended) and ended.reason == "replaced"
        assert await closed(ws) == CloseCode.POLICY
        resumed = await recv(ws2)
        assert isinstance(resumed, Resumed)
        assert (await frames(ws2, 1))[0].block_idx >= resumed.block_idx


async def test_close_ends_the_session_for_good() -> None:
    async with serve() as s:
        ws = await s.connect()
        st = await start(ws, fps=20.0)
        await send(ws, Close())
        ended = await recv_type(ws, Ended)
        assert isinstance(ended, Ended) and ended.reason == "client_close"
        assert await closed(ws) == CloseCode.NORMAL
        assert len(s.service.store) == 0
        ws2 = await s.connect()
        await send(ws2, Resume(st.session_id, st.token, 1))
        err = await recv(ws2)
        assert isinstance(err, Error) and err.code == "missing_session_state"


async def test_at_capacity_a_new_session_gets_an_error_and_close_1013() -> None:
    async with serve(capacity=1) as s:
        ws = await s.connect()
        await start(ws, fps=10.0)
        ws2 = await s.connect()
        await send(ws2, Start())
        err = await recv(ws2)
        assert isinstance(err, Error) and err.code == "at_capacity" and err.fatal
        assert err.retry_after is not None and err.retry_after > 0
        assert await closed(ws2) == 1013
        assert len(await frames(ws, 2)) == 2  # the first session is unaffected


async def test_a_full_model_admits_degraded_then_refuses_with_1013() -> None:
    # Fake costs: 60 ms + 15 ms per chunk at bucket 64 and 4 steps, no batching. One
    # session fits only at the bottom of its ladder (12 fps at bucket 64); a second does not
    # fit at all.
    factory = fake_factory(per_batch=0.06, sleep=False)
    async with serve(runner_factory=factory, admission_threshold=0.85, batching=False) as s:
        ws = await s.connect()
        first = await start(ws, fps=60.0, bucket=128)
        assert first.level > 0 and first.bucket == 64  # admitted degraded, resolution last
        ws2 = await s.connect()
        await send(ws2, Start(fps=60.0, bucket=128))
        err = await recv(ws2)
        assert isinstance(err, Error) and err.code == "at_capacity" and err.retry_after
        assert await closed(ws2) == 1013


async def test_api_key_is_required_when_configured() -> None:
    async with serve(api_keys=frozenset({"sesame"})) as s:
        ws = await s.connect()
        await send(ws, Start())
        err = await recv(ws)
        assert isinstance(err, Error) and err.code == "unauthorized" and err.fatal
        assert await closed(ws) == CloseCode.POLICY
        ws2 = await s.connect()
        await start(ws2, api_key="sesame")
        ws3 = await s.connect(headers={"Authorization": "Bearer sesame"})
        await start(ws3)


async def test_an_oversize_message_closes_1009() -> None:
    async with serve(max_msg_size=4096) as s:
        ws = await s.connect()
        await start(ws, fps=20.0)
        await ws.send_bytes(Prompt("x" * 1000).encode() + b"\x00" * 8000)
        assert await closed(ws) == CloseCode.TOO_BIG
        # a dropped connection: resumable
        await until(lambda: s.service.store.detached_count == 1, what="the session detached")


async def test_keyframe_request_makes_the_next_h264_frame_a_keyframe() -> None:
    async with serve() as s:
        ws = await s.connect()
        await start(ws, fps=40.0, codec="h264")
        got = await frames(ws, 4)
        assert got[0].key and not any(f.key for f in got[1:])
        await send(ws, Keyframe())
        later = await frames(ws, 4)
        assert any(f.key for f in later)


async def test_http_delete_ends_a_session_and_needs_the_key_and_its_token() -> None:
    async with serve(api_keys=frozenset({"k"})) as s:
        ws = await s.connect()
        st = await start(ws, api_key="k")
        url = s.url(f"/v1/sessions/{st.session_id}")
        token = {"X-Session-Token": st.token}
        async with s.http.delete(url, headers=token) as resp:
            assert resp.status == 401  # the API key is still needed
        async with s.http.delete(url, headers={"Authorization": "Bearer k"}) as resp:
            assert resp.status == 401  # a key alone ends nobody's session
        async with s.http.delete(url, headers={"Authorization": "Bearer k", **token}) as resp:
            assert resp.status == 200
        ended = await recv_type(ws, Ended)
        assert isinstance(ended, Ended) and ended.reason == "deleted"


async def test_http_delete_with_a_wrong_token_does_not_say_whether_the_id_exists() -> None:
    async with serve() as s:
        ws = await s.connect()
        st = await start(ws)
        wrong = {"X-Session-Token": "not-the-token"}
        answers = []
        for sid in (st.session_id, "nope"):
            async with s.http.delete(s.url(f"/v1/sessions/{sid}"), headers=wrong) as resp:
                answers.append((resp.status, (await resp.json())["error"]))
        assert answers[0] == answers[1] == (404, "missing_session_state")
        assert s.service.live(st.session_id) is not None  # still there


async def test_the_admin_key_deletes_any_session() -> None:
    async with serve(api_keys=frozenset({"k"}), admin_key="admin-key-1") as s:
        ws = await s.connect()
        st = await start(ws, api_key="k")
        url = s.url(f"/v1/sessions/{st.session_id}")
        async with s.http.delete(url, headers={"Authorization": "Bearer admin-key-1"}) as resp:
            assert resp.status == 200
        async with s.http.delete(s.url("/v1/sessions/nope"), headers={"Authorization": "Bearer admin-key-1"}) as r:
            assert r.status == 404
        ended = await recv_type(ws, Ended)
        assert isinstance(ended, Ended) and ended.reason == "deleted"


async def test_controls_in_flight_when_the_server_ends_a_session_are_not_refused() -> None:
    # A game sends controls whenever it likes; those that cross the server's Ended (a
    # migration's hand-off, a delete) on the wire meet a connection that is closing. They are
    # not read: an error for each would say "send start first" to a client that did.
    async with serve() as s:
        ws = await s.connect()
        st = await start(ws)
        await asyncio.gather(*(send(ws, Action(seq, ("forward",))) for seq in range(1, 40)))
        assert s.service.close(st.session_id, "deleted")  # before the server has read them all
        got = []
        while True:
            msg = await ws.receive(timeout=10)
            if msg.type is not aiohttp.WSMsgType.BINARY:
                break
            got.append(decode_server(msg.data))
        assert any(isinstance(m, Ended) and m.reason == "deleted" for m in got)
        assert not [m for m in got if isinstance(m, Error)], [m for m in got if isinstance(m, Error)]


async def test_health_ready_load_and_metrics_endpoints() -> None:
    async with serve(capacity=1) as s:
        async with s.http.get(s.url("/healthz")) as resp:
            assert resp.status == 200
        async with s.http.get(s.url("/readyz")) as resp:
            assert resp.status == 200
        ws = await s.connect()
        await start(ws, fps=20.0)
        await frames(ws, 2)
        async with s.http.get(s.url("/readyz")) as resp:
            assert resp.status == 503 and (await resp.json())["reason"] == "full"
        async with s.http.get(s.url("/v1/load")) as resp:
            load = await resp.json()
        assert load["active"] == 1 and load["capacity"] == 1 and load["state"] == "ready"
        assert 0 <= load["utilisation"]
        async with s.http.get(s.url("/metrics")) as resp:
            text = await resp.text()
        for name in (
            'worldserve_sessions{state="active"} 1.0',
            "worldserve_frame_latency_seconds_bucket",
            "worldserve_step_seconds_bucket",
            "worldserve_time_to_first_frame_seconds_count 1.0",
            'worldserve_sessions_by_level{level="0"} 1.0',
        ):
            assert name in text, name


async def test_readyz_is_503_while_the_model_warms_up() -> None:
    gate = asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow_factory(settings: object) -> object:
        from tests.server.harness import fake_factory

        asyncio.run_coroutine_threadsafe(gate.wait(), loop).result(10)
        return fake_factory()(settings)  # type: ignore[arg-type]

    from aiohttp.test_utils import TestServer

    from tests.server.harness import TEST_SETTINGS
    from worldserve.server.cluster.worker import create_worker

    app = create_worker(TEST_SETTINGS, runner_factory=slow_factory)  # type: ignore[arg-type]
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(server.make_url("/readyz")) as resp:
                assert resp.status == 503 and (await resp.json())["reason"] == "warming"
            async with http.get(server.make_url("/healthz")) as resp:
                assert resp.status == 200
            ws = await http.ws_connect(server.make_url("/v1/ws"))
            await send(ws, Start())
            err = await recv(ws)
            assert isinstance(err, Error) and err.code == "not_ready" and err.fatal
            assert await closed(ws) == 1013
            gate.set()

            async def ready() -> bool:
                async with http.get(server.make_url("/readyz")) as resp:
                    return resp.status == 200

            await until(ready, what="/readyz answering 200")
    finally:
        gate.set()
        await server.close()


async def test_shutdown_tells_every_client_and_closes_1001() -> None:
    async with serve() as s:
        ws = await s.connect()
        await start(ws, fps=20.0)
        stopping = asyncio.create_task(s.server.close())
        ended = await recv_type(ws, Ended)
        assert isinstance(ended, Ended) and ended.reason == "shutdown"
        assert await closed(ws) == CloseCode.GOING_AWAY
        await stopping
