"""Session records and snapshots."""

from __future__ import annotations

import dataclasses

import pytest

from tests.directory.conftest import Harness
from tests.directory.helpers import add_worker
from worldserve.server.cluster.directory import SessionRecord, SessionState, UnknownSession


async def test_placed_session_is_recorded_active_at_block_zero(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "w")
    await d.place_session("s", 1.0)
    assert await d.get_session("s") == SessionRecord(
        "s", "w", epoch=0, block_idx=0, state=SessionState.ACTIVE, updated=harness.clock()
    )
    assert await d.get_session("other") is None


async def test_update_writes_counters_and_stamps_the_time(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "w")
    await d.place_session("s", 1.0)
    harness.clock.advance(5.0)
    stored = await d.update_session(SessionRecord("s", "w", epoch=3, block_idx=42, updated=0.0))
    assert stored.updated == harness.clock()
    assert await d.get_session("s") == stored


async def test_update_refuses_unknown_sessions_and_moves(harness: Harness) -> None:
    d = harness.directory
    with pytest.raises(UnknownSession):
        await d.update_session(SessionRecord("s", "w"))
    await add_worker(d, "w")
    await d.place_session("s", 1.0)
    with pytest.raises(ValueError, match="place_session"):
        await d.update_session(SessionRecord("s", "elsewhere"))


async def test_migrating_sessions_hold_their_slot_and_orphaned_ones_do_not(
    harness: Harness,
) -> None:
    d = harness.directory
    await add_worker(d, "w", capacity=2)
    await d.place_session("s1", 1.0)
    await d.place_session("s2", 1.0)
    record = await d.get_session("s1")
    assert record is not None
    await d.update_session(dataclasses.replace(record, state=SessionState.MIGRATING))
    assert (await d.get_worker("w")).load == 2  # type: ignore[union-attr]
    await d.update_session(dataclasses.replace(record, state=SessionState.ORPHANED))
    assert (await d.get_worker("w")).load == 1  # type: ignore[union-attr]
    await d.update_session(dataclasses.replace(record, state=SessionState.ACTIVE))
    assert (await d.get_worker("w")).load == 2  # type: ignore[union-attr]


async def test_orphan_sessions_of_marks_only_that_workers_sessions(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "a", capacity=1)
    await add_worker(d, "b", capacity=1)
    on = {sid: (await d.place_session(sid, 1.0)).worker_id for sid in ["s1", "s2"]}
    victim = on["s1"]
    assert await d.orphan_sessions_of(victim) == ["s1"]
    assert (await d.get_session("s1")).state == SessionState.ORPHANED  # type: ignore[union-attr]
    assert (await d.get_session("s2")).state == SessionState.ACTIVE  # type: ignore[union-attr]
    assert await d.orphan_sessions_of(victim) == []


async def test_snapshots_round_trip_and_delete(harness: Harness) -> None:
    d = harness.directory
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value
    await d.put_snapshot("s", data, ttl_s=30.0)
    assert await d.get_snapshot("s") == data
    await d.put_snapshot("s", b"\x00newer", ttl_s=30.0)
    assert await d.get_snapshot("s") == b"\x00newer"
    assert await d.get_snapshot("other") is None
    assert await d.delete_snapshot("s") is True
    assert await d.get_snapshot("s") is None
    assert await d.delete_snapshot("s") is False


async def test_snapshots_expire_after_their_ttl(harness: Harness) -> None:
    d = harness.directory
    await d.put_snapshot("short", b"a", ttl_s=1.0)
    await d.put_snapshot("long", b"b", ttl_s=30.0)
    assert await d.get_snapshot("short") == b"a"
    await harness.elapse(1.1)
    assert await d.get_snapshot("short") is None
    assert await d.delete_snapshot("short") is False
    assert await d.get_snapshot("long") == b"b"


async def test_a_lost_session_record_is_written_again_but_never_over_an_existing_one(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "a")
    await add_worker(d, "b")
    lost = SessionRecord("s", "a", 2, 30, SessionState.ACTIVE, token_hash="ab" * 32)
    assert await d.recreate_session(lost)
    rec = await d.get_session("s")
    assert rec is not None and (rec.worker_id, rec.epoch, rec.block_idx, rec.state) == ("a", 2, 30, SessionState.ACTIVE)
    assert rec.token_hash == "ab" * 32 and (await d.get_worker("a")).load == 1  # type: ignore[union-attr]
    assert not await d.recreate_session(SessionRecord("s", "b", 3, 1, SessionState.ACTIVE))
    rec = await d.get_session("s")
    assert rec is not None and rec.worker_id == "a"
