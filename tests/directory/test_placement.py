"""Placement: least loaded first, serving workers only, never past capacity."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter

import pytest

from tests.directory.conftest import Harness
from tests.directory.helpers import add_worker
from worldserve.server.cluster.directory import NoWorkerAvailable, SessionState, WorkerState


async def test_placement_prefers_the_least_loaded_worker(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "a", load=2)
    await add_worker(d, "b")
    assert (await d.place_session("s1", 1.0)).worker_id == "b"
    placed = await d.place_session("s2", 1.0)
    assert (placed.worker_id, placed.load) == ("b", 2)
    # 2/4 each: the lower utilisation wins, then the lower id.
    assert (await d.place_session("s3", 1.0)).worker_id == "a"
    await d.heartbeat("a", 2, 0.5, WorkerState.SERVING, 30.0)
    await d.heartbeat("b", 0, 0.1, WorkerState.SERVING, 30.0)  # 2 placed still count
    assert (await d.place_session("s4", 1.0)).worker_id == "b"


async def test_load_is_compared_relative_to_capacity(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "big", capacity=10, load=4)
    await add_worker(d, "small", capacity=2, load=1)
    assert (await d.place_session("s", 1.0)).worker_id == "big"


async def test_draining_and_starting_workers_get_no_new_sessions(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "a", state=WorkerState.DRAINING)
    await add_worker(d, "b", state=WorkerState.STARTING)
    await add_worker(d, "c", capacity=1)
    assert (await d.place_session("s1", 1.0)).worker_id == "c"
    with pytest.raises(NoWorkerAvailable):  # c is full; a and b take nothing
        await d.place_session("s2", 1.0)
    await d.set_worker_state("c", WorkerState.DRAINING)
    with pytest.raises(NoWorkerAvailable) as err:
        await d.place_session("s3", 1.0)
    assert (err.value.live, err.value.serving) == (3, 0)
    await d.set_worker_state("b", WorkerState.SERVING)
    assert (await d.place_session("s3", 1.0)).worker_id == "b"


async def test_workers_at_the_utilisation_threshold_get_no_sessions(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "hot", utilisation=0.8)
    with pytest.raises(NoWorkerAvailable):
        await d.place_session("s", threshold=0.8)
    assert (await d.place_session("s", threshold=0.81)).worker_id == "hot"


async def test_full_workers_raise_no_worker_available_with_retry_after(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "a", capacity=1)
    await add_worker(d, "b", capacity=1)
    await add_worker(d, "none", capacity=0)
    await d.place_session("s1", 1.0)
    await d.place_session("s2", 1.0)
    with pytest.raises(NoWorkerAvailable) as err:
        await d.place_session("s3", 1.0)
    assert err.value.retry_after_s > 0
    assert (err.value.live, err.value.serving) == (3, 3)
    assert err.value.code == "no_worker_available"
    assert await d.get_session("s3") is None


async def test_concurrent_placements_never_exceed_capacity(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "a", capacity=4)
    await add_worker(d, "b", capacity=4)
    clients = [d, harness.peer()]  # two routers racing

    async def place(i: int) -> str | None:
        try:
            return (await clients[i % 2].place_session(f"s{i}", 1.0)).worker_id
        except NoWorkerAvailable:
            return None

    results = await asyncio.gather(*(place(i) for i in range(50)))
    assert Counter(results) == {"a": 4, "b": 4, None: 42}
    assert [(w.worker_id, w.load) for w in await d.list_workers()] == [("a", 4), ("b", 4)]
    for i, wid in enumerate(results):
        record = await d.get_session(f"s{i}")
        assert (record.worker_id if record else None) == wid


async def test_releasing_a_session_frees_its_slot(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "w", capacity=1)
    await d.place_session("s1", 1.0)
    with pytest.raises(NoWorkerAvailable):
        await d.place_session("s2", 1.0)
    assert await d.release_session("s1") is True
    assert await d.get_session("s1") is None
    assert (await d.place_session("s2", 1.0)).load == 1
    assert await d.release_session("s1") is False


async def test_reported_load_fills_slots_the_directory_did_not_place(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "w", capacity=2)
    await d.heartbeat("w", 2, 0.0, WorkerState.SERVING, 30.0)
    with pytest.raises(NoWorkerAvailable):
        await d.place_session("s", 1.0)


async def test_placing_a_known_session_moves_it_and_keeps_its_counters(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "old")
    await d.place_session("s", 1.0)
    record = await d.get_session("s")
    assert record is not None
    await d.update_session(
        dataclasses.replace(record, epoch=2, block_idx=17, state=SessionState.MIGRATING)
    )
    await d.set_worker_state("old", WorkerState.DRAINING)
    await add_worker(d, "new")
    assert (await d.place_session("s", 1.0)).worker_id == "new"
    moved = await d.get_session("s")
    assert moved is not None
    assert (moved.worker_id, moved.epoch, moved.block_idx, moved.state) == (
        "new",
        2,
        17,
        SessionState.ACTIVE,
    )
    old = await d.get_worker("old")
    assert old is not None and old.load == 0
