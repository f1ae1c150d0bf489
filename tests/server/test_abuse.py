"""What an abusive or unlucky client cannot do to a worker: make it work before it is
authorised or admitted, or make a refused start cost someone else's session."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.polling import until
from tests.server.harness import fake_factory, recv, send, serve
from worldserve.protocol import Error, Start, Started

# Fake costs: 60 ms + 15 ms per chunk at bucket 64 and 4 steps, no batching: one session
# at 12 fps and bucket 64 fills the model (tests/server/test_ws_protocol.py).
FULL = dict(runner_factory=fake_factory(per_batch=0.06, sleep=False), admission_threshold=0.85, batching=False)


async def _start(ws: aiohttp.ClientWebSocketResponse, **kw: Any) -> Started:
    await send(ws, Start(**kw))
    msg = await recv(ws)
    assert isinstance(msg, Started), msg
    return msg


async def test_a_start_the_model_cannot_admit_renders_no_first_frame() -> None:
    async with serve(**FULL) as s:  # type: ignore[arg-type]
        ws = await s.connect()
        await _start(ws, fps=60.0, bucket=128)
        runner = s.service.engine.runner
        made: list[int] = []
        first_frame = runner.first_frame
        runner.first_frame = lambda *a: made.append(1) or first_frame(*a)  # type: ignore[method-assign]
        ws2 = await s.connect()
        await send(ws2, Start(fps=60.0, bucket=128))
        err = await recv(ws2)
        assert isinstance(err, Error) and err.code == "at_capacity"
        assert made == []


async def test_a_refused_start_never_evicts_a_detached_session() -> None:
    async with serve(capacity=2, **FULL) as s:  # type: ignore[arg-type]
        ws = await s.connect()
        away = await _start(ws, fps=12.0, bucket=64)
        await ws.close()  # dropped: the session waits for its user to resume
        await until(lambda: s.service.store.detached_count == 1, what="the session detached")
        await until(lambda: away.session_id not in s.service.engine.scheduler, what="out of the engine")
        ws2 = await s.connect()  # held open: its session stays attached
        await _start(ws2, fps=60.0, bucket=128)  # admitted degraded: the model is full
        for _ in range(3):
            ws3 = await s.connect()
            await send(ws3, Start(fps=60.0, bucket=128))
            err = await recv(ws3)
            assert isinstance(err, Error) and err.code == "at_capacity"
        assert s.service.store.peek(away.session_id) is not None  # still resumable


async def _answers(ws: aiohttp.ClientWebSocketResponse, n: int) -> list[Any]:
    """The next ``n`` acks and errors (frames skipped)."""
    from worldserve.protocol import Ack

    got: list[Any] = []
    while len(got) < n:
        msg = await recv(ws)
        if isinstance(msg, Ack | Error):
            got.append(msg)
    return got


async def test_prompts_faster_than_one_a_chunk_period_are_refused_as_rate_limited() -> None:
    from worldserve.protocol import Ack, Prompt

    async with serve(input_burst=2) as s:
        ws = await s.connect()
        await _start(ws, fps=4.0)  # a chunk period of a quarter second or more
        for i in range(12):
            await send(ws, Prompt(f"a scene {i}", id=i))
        got = await _answers(ws, 12)
        acked = [m for m in got if isinstance(m, Ack)]
        refused = [m for m in got if isinstance(m, Error)]
        assert 2 <= len(acked) <= 4, got  # the burst, and what a period or so earns on a slow machine
        assert refused and all(e.code == "rate_limited" and e.field == "prompt" and not e.fatal for e in refused)


async def test_new_epochs_in_pull_mode_share_the_costly_input_budget() -> None:
    from worldserve.protocol import Block

    async with serve(input_burst=1) as s:
        ws = await s.connect()
        await _start(ws, fps=4.0, mode="pull")
        errors: list[Error] = []
        for _ in range(6):
            await send(ws, Block(0))
        while len(errors) < 4:
            msg = await recv(ws)
            if isinstance(msg, Error):
                errors.append(msg)
        assert all(e.code == "rate_limited" and e.field == "block_idx" for e in errors)


async def test_a_resume_spends_the_token_it_used_and_a_takeover_gets_its_own() -> None:
    from worldserve.protocol import Ended, Resume, Resumed

    async with serve() as s:
        owner = await s.connect()
        st = await _start(owner, fps=10.0)
        thief = await s.connect()
        await send(thief, Resume(st.session_id, st.token, 1))  # a leaked token takes over once
        took = await recv(thief)
        assert isinstance(took, Resumed) and took.token and took.token != st.token
        ended = await recv(owner)
        while not isinstance(ended, Ended):
            ended = await recv(owner)
        again = await s.connect()
        await send(again, Resume(st.session_id, st.token, 1))  # the leaked token is spent
        err = await recv(again)
        assert isinstance(err, Error) and err.code == "bad_token"


async def test_a_token_older_than_the_maximum_age_no_longer_resumes() -> None:
    from worldserve.protocol import Resume

    async with serve(max_token_age_s=0.2) as s:
        ws = await s.connect()
        st = await _start(ws, fps=10.0)
        await ws.close()
        session = s.service.store.peek(st.session_id)
        assert session is not None
        await until(lambda: s.service.clock() - session.token_issued_at > 0.3, what="the token aged")
        ws2 = await s.connect()
        await send(ws2, Resume(st.session_id, st.token, 1))
        err = await recv(ws2)
        assert isinstance(err, Error) and err.code == "bad_token"


async def test_a_runner_error_reaches_the_client_without_the_exception_text() -> None:
    async with serve() as s:
        ws = await s.connect()
        st = await _start(ws, fps=10.0)
        s.service.engine.runner.fail[st.session_id] = "CUDA OOM at /srv/weights/secret.safetensors"
        while True:
            msg = await recv(ws)
            if isinstance(msg, Error):
                break
        assert msg.code == "runner_error" and "secret" not in msg.message and "/srv" not in msg.message


async def test_a_new_epoch_s_start_frame_is_made_off_the_loop_and_the_model_thread() -> None:
    import threading

    from worldserve.protocol import Block, Frame

    async with serve() as s:
        ws = await s.connect()
        st = await _start(ws, fps=8.0, mode="pull")
        runner = s.service.engine.runner
        threads: list[str] = []
        first_frame = runner.first_frame

        def recording(*a: Any) -> Any:
            threads.append(threading.current_thread().name)
            return first_frame(*a)

        runner.first_frame = recording  # type: ignore[method-assign]
        await send(ws, Block(0))  # a new epoch
        await until(lambda: s.service.live(st.session_id).epoch == 1, what="the new epoch")  # type: ignore[union-attr]
        msg = await recv(ws)
        while not (isinstance(msg, Frame) and msg.block_idx == 0):
            msg = await recv(ws)
        assert len(threads) == 1
        assert threads[0] != threading.main_thread().name and not threads[0].startswith("worldserve-model")


async def test_a_new_epoch_does_not_get_a_fresh_pull_budget() -> None:
    from worldserve.protocol import Block

    async with serve(input_burst=4) as s:
        ws = await s.connect()
        st = await _start(ws, fps=4.0, mode="pull")
        sid, sched = st.session_id, s.service.engine.scheduler  # type: ignore[union-attr]
        period = st.chunk_frames / st.fps
        for n in (1, 2, 3):
            await send(ws, Block(n))
        # blocks 0 to 3 asked for: the rate clock is about four periods ahead
        await until(lambda: sched.pull_tat(sid) - sched.clock() > 3.5 * period, what="four blocks charged")
        used = sched.pull_tat(sid)
        await send(ws, Block(0))  # a new epoch, then its block 0
        await until(lambda: s.service.live(sid).epoch == 1, what="the new epoch")  # type: ignore[union-attr]
        assert sched.pull_tat(sid) >= used + 0.99 * period  # charged after what the last epoch used
