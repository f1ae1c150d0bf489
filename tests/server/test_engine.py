"""The asyncio engine loop with the fake runner, in real (short) time."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from tests.polling import until
from worldserve.server.engine import Engine
from worldserve.session.admission import AdmissionOptions
from worldserve.session.costmodel import CostModel
from worldserve.session.degrade import DegradationChanged
from worldserve.session.fake_runner import FakeRunner, LinearCost
from worldserve.session.plan import SessionSpec
from worldserve.session.scheduler import (
    ChunkReady,
    Event,
    Mode,
    RunnerError,
    RunnerInfo,
    Scheduler,
    SchedulerOptions,
)

SIZES = (1, 2, 4, 8)


def make(
    per_batch: float = 0.002, *, sleep: object = time.sleep, **kw: object
) -> tuple[Engine, FakeRunner, list[Event]]:
    runner = FakeRunner(cost=LinearCost({64: (per_batch, 0.0), 128: (per_batch, 0.0)}))
    runner.sleep = sleep  # type: ignore[assignment]
    options = SchedulerOptions(admission=AdmissionOptions(threshold=1e9))
    sched = Scheduler(
        RunnerInfo.of(runner, SIZES), CostModel(runner.warmup(SIZES)), options=options
    )
    events: list[Event] = []
    kw.setdefault("on_event", events.append)
    engine = Engine(sched, runner, **kw)  # type: ignore[arg-type]
    return engine, runner, events


def add(engine: Engine, sid: str, **kw: object) -> None:
    verdict = engine.add_session(sid, SessionSpec(sid, 64, 0, ""), **{"fps": 100.0, **kw})  # type: ignore[arg-type]
    assert verdict.admitted


def chunks(events: list[Event], sid: str) -> list[int]:
    return [e.block_idx for e in events if isinstance(e, ChunkReady) and e.session_id == sid]


async def wait_chunks(events: list[Event], sid: str, n: int) -> list[ChunkReady]:
    """The first ``n`` chunks the engine emitted for ``sid``."""
    await until(lambda: len(chunks(events, sid)) >= n, what=f"{n} chunks of {sid}")
    return [e for e in events if isinstance(e, ChunkReady) and e.session_id == sid][:n]


async def test_push_chunks_are_emitted_once_each_in_block_order() -> None:
    engine, _, events = make()
    await engine.start()
    add(engine, "a")
    add(engine, "b")
    await wait_chunks(events, "a", 15)
    await wait_chunks(events, "b", 15)
    await engine.stop()
    for sid in ("a", "b"):
        blocks = chunks(events, sid)
        assert len(blocks) >= 15 and blocks == list(range(len(blocks)))


async def test_the_event_loop_is_never_blocked_by_model_work() -> None:
    # the model runs on its own thread: while a batch is under way (80 ms asleep in the fake
    # runner) the loop goes on turning, however slow the machine
    running = threading.Event()
    loop_thread = threading.get_ident()
    batch_threads: list[int] = []

    def sleep_in_batch(seconds: float) -> None:
        batch_threads.append(threading.get_ident())
        running.set()
        time.sleep(seconds)
        running.clear()

    engine, _, _ = make(per_batch=0.080, sleep=sleep_in_batch)
    await engine.start()
    add(engine, "s", fps=10.0)
    turns_in_batch = 0
    await until(lambda: running.is_set(), what="a batch under way")
    end = time.monotonic() + 30.0
    while turns_in_batch < 10 and time.monotonic() < end:  # batches follow one another at 10 fps
        await asyncio.sleep(0)
        turns_in_batch += running.is_set()
    await engine.stop()
    assert turns_in_batch >= 10  # the loop turned again and again inside a batch
    assert batch_threads and loop_thread not in batch_threads


async def test_new_work_wakes_an_idle_engine_at_once() -> None:
    engine, _, events = make()
    await engine.start()
    await asyncio.sleep(0.05)  # idle: nothing to schedule, no timeout pending
    add(engine, "p", mode=Mode.PULL)
    assert engine.request_block("p", 0)
    (item,) = await wait_chunks(events, "p", 1)
    assert item.block_idx == 0 and item.display_time is None  # without a wake-up: never (until's limit)
    await engine.stop()


async def test_pull_blocks_are_emitted_in_order() -> None:
    engine, _, events = make()
    await engine.start()
    add(engine, "p", mode=Mode.PULL)
    for b in range(3):
        engine.request_block("p", b)
    got = await wait_chunks(events, "p", 3)
    assert [g.block_idx for g in got] == [0, 1, 2]
    await engine.stop()


@pytest.mark.parametrize(("batching", "sizes"), [(True, {3}), (False, {1})])
async def test_batching_flag_turns_cross_session_batching_on_and_off(
    batching: bool, sizes: set[int]
) -> None:
    engine, runner, _ = make(batching=batching)
    add(engine, "a")
    add(engine, "b")
    add(engine, "c")
    await engine.start()
    await until(lambda: sum(runner.batch_sizes.values()) >= 3, what="three batches")
    await engine.stop()
    assert set(runner.batch_sizes) == sizes


async def test_stop_cancels_the_loop_and_waits_for_the_model_thread() -> None:
    inside, done = threading.Event(), threading.Event()

    def slow(seconds: float) -> None:
        inside.set()
        time.sleep(0.1)
        done.set()

    engine, _, _ = make(sleep=slow)
    add(engine, "s")
    await engine.start()
    await until(inside.is_set, what="the model thread inside execute()")
    await engine.stop()
    assert done.is_set() and not engine.running
    await engine.stop()  # idempotent


async def test_a_failing_runner_is_logged_with_session_ids_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine, runner, events = make()
    runner.raise_next = RuntimeError("boom")
    add(engine, "s")
    with caplog.at_level(logging.ERROR, logger="worldserve.server.engine"):
        await engine.start()
        await wait_chunks(events, "s", 3)
        await engine.stop()
    assert any("'s'" in r.getMessage() and r.exc_info for r in caplog.records)
    errors = [e for e in events if isinstance(e, RunnerError)]
    assert errors and "boom" in errors[0].message
    assert len(chunks(events, "s")) >= 3  # later plans still ran


async def test_an_event_handler_error_is_logged_with_the_session_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def handler(ev: Event) -> None:
        raise ValueError("bad handler")

    engine, _, _ = make(on_event=handler)  # replaces the collecting handler
    add(engine, "s")
    with caplog.at_level(logging.ERROR, logger="worldserve.server.engine"):
        await engine.start()
        await until(lambda: any("session s" in r.getMessage() for r in caplog.records),
                    what="the handler's error logged")
        await engine.stop()
    assert any("session s" in r.getMessage() for r in caplog.records)
    assert engine.failure is None


async def test_suspend_returns_the_next_block_and_state_and_adding_back_continues_there() -> None:
    engine, _runner, events = make()
    await engine.start()
    add(engine, "s")
    await wait_chunks(events, "s", 5)
    susp = await engine.suspend("s")
    assert "s" not in engine.scheduler  # the runner frees its state in the next plan
    assert susp.next_block == max(chunks(events, "s")) + 1
    assert susp.state is not None and susp.state.frame_index == susp.next_block
    verdict = engine.add_session(
        "s", SessionSpec("s", 64, 0, "", restore=susp.state), fps=100.0,
        first_block=susp.next_block,
    )
    assert verdict.admitted
    after = await wait_chunks(events, "s", susp.next_block + 1)
    assert after[-1].block_idx == susp.next_block
    await engine.stop()
    blocks = chunks(events, "s")
    assert blocks == list(range(len(blocks)))  # no gap, no repeat across the suspension


async def test_suspend_of_an_unscheduled_session_is_a_key_error() -> None:
    engine, _, _ = make()
    await engine.start()
    with pytest.raises(KeyError):
        await engine.suspend("nope")
    await engine.stop()


async def test_a_session_too_slow_for_every_slot_is_degraded_instead_of_skipping_forever() -> None:
    # 50 ms a chunk at 4 steps against a 41.7 ms period: every slot is skipped until the
    # ladder moves, and the control tick must run although no plan executes.
    engine, _, events = make(per_batch=0.050)
    await engine.start()
    add(engine, "s", fps=24.0, lookahead=0)
    await until(
        lambda: any(isinstance(e, DegradationChanged) for e in events)
        and len(chunks(events, "s")) >= 10,
        timeout=60.0,
        what="a degradation and 10 chunks",
    )
    await engine.stop()
    assert any(isinstance(e, DegradationChanged) for e in events)
    assert len(chunks(events, "s")) >= 10
