"""A handed-over (migrating) session holds its target's slot only until the handover TTL:
if its client does not resume there by then, it is orphaned and the slot is free again."""

from __future__ import annotations

import dataclasses

import pytest

from tests.directory.conftest import Harness
from tests.directory.helpers import add_worker
from worldserve.server.cluster.directory import (
    Directory,
    MemoryDirectory,
    NoWorkerAvailable,
    SessionRecord,
    SessionState,
    WorkerState,
)
from worldserve.server.cluster.directory.redis import RedisDirectory

HANDOVER_TTL = 1.5  # real seconds on Redis: long enough that a busy machine's stalls stay inside the margins
MARGIN = 0.5  # past a deadline by this much before asserting what follows it


async def hand_over(d: Directory, sid: str = "s", *, epoch: int = 2, block_idx: int = 40) -> None:
    """What a draining worker does: ``sid`` runs on "src", which starts draining and hands
    it to "dst" (capacity 1): placed there, then written migrating."""
    await add_worker(d, "src")
    await d.place_session(sid, 1.0)
    await d.update_session(SessionRecord(sid, "src", epoch, block_idx, SessionState.ACTIVE))
    await add_worker(d, "dst", capacity=1)
    await d.set_worker_state("src", WorkerState.DRAINING)
    assert (await d.place_session(sid, 1.0)).worker_id == "dst"
    await d.update_session(SessionRecord(sid, "dst", epoch, block_idx, SessionState.MIGRATING))


async def load(d: Directory, worker_id: str) -> int:
    w = await d.get_worker(worker_id)
    assert w is not None, worker_id
    return w.load


async def test_a_handover_nobody_resumes_gives_the_target_s_slot_back(harness: Harness) -> None:
    d = harness.with_handover_ttl(HANDOVER_TTL)
    await hand_over(d)
    assert await load(d, "dst") == 1
    with pytest.raises(NoWorkerAvailable):  # src drains, dst is full
        await d.place_session("new", 1.0)
    await harness.elapse(HANDOVER_TTL / 2)
    rec = await d.get_session("s")
    assert rec is not None and rec.state is SessionState.MIGRATING
    assert await load(d, "dst") == 1
    await harness.elapse(HANDOVER_TTL / 2 + MARGIN)
    assert await load(d, "dst") == 0
    assert [(w.worker_id, w.load) for w in await d.list_workers()] == [("dst", 0), ("src", 0)]
    rec = await d.get_session("s")
    assert rec is not None
    assert (rec.worker_id, rec.state, rec.epoch, rec.block_idx) == (
        "dst", SessionState.ORPHANED, 2, 40
    )
    assert (await d.place_session("new", 1.0)).worker_id == "dst"


async def test_placement_itself_sees_the_slot_freed(harness: Harness) -> None:
    d = harness.with_handover_ttl(HANDOVER_TTL)
    await hand_over(d)
    await harness.elapse(HANDOVER_TTL + MARGIN)
    # Nothing read the session or the worker since: the placement finds the slot free.
    placed = await d.place_session("new", 1.0)
    assert (placed.worker_id, placed.load) == ("dst", 1)


async def test_a_resumed_handover_keeps_its_slot(harness: Harness) -> None:
    d = harness.with_handover_ttl(HANDOVER_TTL)
    await hand_over(d)
    await harness.elapse(HANDOVER_TTL / 2)
    # The client resumed at the target, which writes the session active.
    await d.update_session(SessionRecord("s", "dst", 2, 41, SessionState.ACTIVE))
    await harness.elapse(HANDOVER_TTL + MARGIN)
    rec = await d.get_session("s")
    assert rec is not None and (rec.state, rec.block_idx) == (SessionState.ACTIVE, 41)
    assert await load(d, "dst") == 1
    assert await d.reap_dead_workers() == {}
    assert await load(d, "dst") == 1


async def test_writing_migrating_again_restarts_the_countdown(harness: Harness) -> None:
    d = harness.with_handover_ttl(HANDOVER_TTL)
    await hand_over(d)
    await harness.elapse(HANDOVER_TTL * 0.7)
    await d.update_session(SessionRecord("s", "dst", 2, 40, SessionState.MIGRATING))
    await harness.elapse(HANDOVER_TTL * 0.7)
    assert (await d.get_session("s")).state is SessionState.MIGRATING  # type: ignore[union-attr]
    assert await load(d, "dst") == 1
    await harness.elapse(HANDOVER_TTL * 0.3 + MARGIN)
    assert (await d.get_session("s")).state is SessionState.ORPHANED  # type: ignore[union-attr]


async def test_an_expired_handover_is_resumable_through_a_new_placement(harness: Harness) -> None:
    d = harness.with_handover_ttl(HANDOVER_TTL)
    await hand_over(d)
    await add_worker(d, "other", capacity=1)
    await harness.elapse(HANDOVER_TTL + MARGIN)
    # A late client asks the router, which places the orphan again (epoch and block stay).
    worker = await d.place_session("s", 1.0)
    rec = await d.get_session("s")
    assert rec is not None and rec.worker_id == worker.worker_id
    assert (rec.state, rec.epoch, rec.block_idx) == (SessionState.ACTIVE, 2, 40)
    assert worker.load == 1
    await harness.elapse(HANDOVER_TTL + MARGIN)  # placed sessions are not handovers
    assert (await d.get_session("s")).state is SessionState.ACTIVE  # type: ignore[union-attr]


async def test_an_expired_handover_s_record_lapses_like_an_orphan(harness: Harness) -> None:
    d = harness.with_handover_ttl(HANDOVER_TTL, orphan_ttl_s=1.0)
    await hand_over(d)
    await harness.elapse(HANDOVER_TTL + MARGIN)
    assert (await d.get_session("s")).state is SessionState.ORPHANED  # type: ignore[union-attr]
    await harness.elapse(1.0 + MARGIN)
    assert await d.get_session("s") is None
    assert await load(d, "dst") == 0


@pytest.mark.parametrize("then", ["moved", "released", "released_and_placed_again"])
async def test_a_handover_that_ended_otherwise_leaves_no_countdown(
    harness: Harness, then: str
) -> None:
    d = harness.with_handover_ttl(HANDOVER_TTL)
    await hand_over(d)
    if then == "moved":
        await add_worker(d, "other", capacity=1)
        await d.set_worker_state("dst", WorkerState.DRAINING)
        assert (await d.place_session("s", 1.0)).worker_id == "other"
        holder = "other"
    else:
        assert await d.release_session("s") is True
        holder = "dst"
        if then == "released_and_placed_again":
            assert (await d.place_session("s", 1.0)).worker_id == "dst"
    await harness.elapse(HANDOVER_TTL + MARGIN)
    rec = await d.get_session("s")
    if then == "released":
        assert rec is None
        assert await load(d, "dst") == 0
    else:
        assert rec is not None and (rec.worker_id, rec.state) == (holder, SessionState.ACTIVE)
        assert await load(d, holder) == 1


async def test_a_migrating_write_on_an_unregistered_worker_is_no_handover(
    harness: Harness,
) -> None:
    d = harness.with_handover_ttl(HANDOVER_TTL, orphan_ttl_s=HANDOVER_TTL + 2 * MARGIN)
    await add_worker(d, "w")
    await d.place_session("s", 1.0)
    await d.deregister_worker("w")
    # A draining worker with no target marks the session migrating on itself and leaves.
    stored = await d.update_session(SessionRecord("s", "w", 0, 5, SessionState.MIGRATING))
    assert stored.state is SessionState.MIGRATING
    await harness.elapse(HANDOVER_TTL + MARGIN)
    rec = await d.get_session("s")
    assert rec is not None and rec.state is SessionState.MIGRATING  # lapses with the orphans
    await harness.elapse(2 * MARGIN)
    assert await d.get_session("s") is None


async def test_orphaning_the_target_ends_the_countdown(harness: Harness) -> None:
    d = harness.with_handover_ttl(HANDOVER_TTL)
    await hand_over(d)
    assert await d.orphan_sessions_of("dst") == ["s"]
    rec = await d.get_session("s")
    assert rec is not None
    # The target comes back to it (a late resume arriving there): active, and it stays.
    await d.update_session(dataclasses.replace(rec, state=SessionState.ACTIVE))
    await harness.elapse(HANDOVER_TTL + MARGIN)
    assert (await d.get_session("s")).state is SessionState.ACTIVE  # type: ignore[union-attr]
    assert await load(d, "dst") == 1


def test_the_handover_ttl_is_validated() -> None:
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="handover_ttl_s"):
            MemoryDirectory(handover_ttl_s=bad)
        with pytest.raises(ValueError, match="handover_ttl_s"):
            RedisDirectory("redis://127.0.0.1:1/0", handover_ttl_s=bad)
