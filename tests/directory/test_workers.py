"""Worker registration, heartbeats with TTL, state, and reaping of dead workers."""

from __future__ import annotations

import pytest

from tests.directory.conftest import Harness
from tests.directory.helpers import add_worker
from worldserve.server.cluster.directory import (
    NoWorkerAvailable,
    SessionRecord,
    SessionState,
    UnknownWorker,
    WorkerInfo,
    WorkerState,
)


async def test_registered_worker_is_listed_with_its_info(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "w1", capacity=8, load=3, utilisation=0.25)
    await add_worker(d, "w0", state=WorkerState.STARTING)
    workers = await d.list_workers()
    assert [w.worker_id for w in workers] == ["w0", "w1"]
    w1 = workers[1]
    assert (w1.address, w1.state, w1.capacity, w1.load, w1.utilisation) == (
        "http://w1.test:8000",
        WorkerState.SERVING,
        8,
        3,
        0.25,
    )
    assert w1.heartbeat == harness.clock()
    assert await d.get_worker("w1") == w1
    assert await d.get_worker("nobody") is None


async def test_worker_disappears_when_its_heartbeat_ttl_lapses(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "short", ttl_s=1.0)
    await add_worker(d, "long")
    assert await d.get_worker("short") is not None
    await harness.elapse(1.1)
    assert [w.worker_id for w in await d.list_workers()] == ["long"]
    assert await d.get_worker("short") is None
    await d.set_worker_state("long", WorkerState.DRAINING)
    with pytest.raises(NoWorkerAvailable) as err:
        await d.place_session("s1", threshold=1.0)
    assert (err.value.live, err.value.serving) == (1, 0)


async def test_heartbeat_renews_the_ttl_and_reports_load(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "w", ttl_s=1.0)
    await harness.elapse(0.6)
    await d.heartbeat("w", load=2, utilisation=0.5, state=WorkerState.DRAINING, ttl_s=1.0)
    beat = harness.clock()
    await harness.elapse(0.6)  # 1.2 s after registering, 0.6 s after the heartbeat
    w = await d.get_worker("w")
    assert w is not None
    assert (w.load, w.utilisation, w.state, w.heartbeat) == (
        2,
        0.5,
        WorkerState.DRAINING,
        beat,
    )


async def test_heartbeat_from_an_unknown_or_reaped_worker_raises(harness: Harness) -> None:
    d = harness.directory
    with pytest.raises(UnknownWorker):
        await d.heartbeat("ghost", 0, 0.0, WorkerState.SERVING, 1.0)
    with pytest.raises(UnknownWorker):
        await d.set_worker_state("ghost", WorkerState.DRAINING)
    await add_worker(d, "w")
    assert await d.deregister_worker("w") == []
    with pytest.raises(UnknownWorker):
        await d.heartbeat("w", 0, 0.0, WorkerState.SERVING, 1.0)
    assert await d.list_workers() == []


async def test_deregistering_a_worker_orphans_its_sessions(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "w")
    await d.place_session("s2", 1.0)
    await d.place_session("s1", 1.0)
    assert await d.deregister_worker("w") == ["s1", "s2"]
    record = await d.get_session("s1")
    assert record is not None
    assert (record.worker_id, record.state) == ("w", SessionState.ORPHANED)


async def test_reaping_orphans_the_sessions_of_dead_workers_only(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "dead", ttl_s=1.0, capacity=2)
    await add_worker(d, "alive", capacity=1)
    placed = {sid: (await d.place_session(sid, 1.0)).worker_id for sid in ["a", "b", "c"]}
    assert sorted(placed.values()) == ["alive", "dead", "dead"]
    assert await d.reap_dead_workers() == {}
    await harness.elapse(1.1)
    dead_sids = sorted(sid for sid, wid in placed.items() if wid == "dead")
    assert await d.reap_dead_workers() == {"dead": dead_sids}
    for sid, wid in placed.items():
        record = await d.get_session(sid)
        assert record is not None
        want = SessionState.ORPHANED if wid == "dead" else SessionState.ACTIVE
        assert (record.worker_id, record.state) == (wid, want)
    assert await d.reap_dead_workers() == {}
    with pytest.raises(UnknownWorker):  # it must register again, as a new worker
        await d.heartbeat("dead", 0, 0.0, WorkerState.SERVING, 1.0)


async def test_bad_ttls_and_reports_are_refused(harness: Harness) -> None:
    d = harness.directory
    info = WorkerInfo("w", "http://w:1")
    for ttl in [0, -1.0, float("nan"), float("inf")]:
        with pytest.raises(ValueError, match="ttl_s"):
            await d.register_worker(info, ttl)
    await d.register_worker(info, 5.0)
    with pytest.raises(ValueError, match="load"):
        await d.heartbeat("w", -1, 0.0, WorkerState.SERVING, 5.0)
    with pytest.raises(ValueError, match="utilisation"):
        await d.heartbeat("w", 0, float("nan"), WorkerState.SERVING, 5.0)
    with pytest.raises(ValueError, match="threshold"):
        await d.place_session("s", float("nan"))


def test_records_validate_their_fields() -> None:
    with pytest.raises(ValueError, match="worker_id"):
        WorkerInfo("", "http://w:1")
    with pytest.raises(ValueError, match="capacity"):
        WorkerInfo("w", "http://w:1", capacity=-1)
    with pytest.raises(ValueError, match="'busy'"):
        WorkerInfo("w", "http://w:1", state="busy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_idx"):
        SessionRecord("s", "w", block_idx=-1)
    with pytest.raises(ValueError, match="session_id"):
        SessionRecord("x" * 129, "w")
