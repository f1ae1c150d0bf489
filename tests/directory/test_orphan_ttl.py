"""Records of sessions whose worker is gone lapse after the orphan TTL; others stay."""

from __future__ import annotations

import dataclasses

import pytest

from tests.directory.conftest import Harness
from tests.directory.helpers import add_worker
from worldserve.server.cluster.directory import (
    MemoryDirectory,
    SessionRecord,
    SessionState,
    UnknownSession,
)
from worldserve.server.cluster.directory.redis import RedisDirectory

ORPHAN_TTL = 1.0


async def test_a_dead_worker_s_orphans_lapse_unless_placed_again(harness: Harness) -> None:
    d = harness.with_orphan_ttl(ORPHAN_TTL)
    await add_worker(d, "dead", ttl_s=0.5)
    await d.place_session("gone", 1.0)
    await d.place_session("moved", 1.0)
    await add_worker(d, "alive")
    await harness.elapse(0.6)
    assert await d.reap_dead_workers() == {"dead": ["gone", "moved"]}
    assert (await d.place_session("moved", 1.0)).worker_id == "alive"
    await harness.elapse(ORPHAN_TTL / 2)
    kept = await d.get_session("gone")
    assert kept is not None and kept.state is SessionState.ORPHANED  # still resumable
    await harness.elapse(ORPHAN_TTL / 2 + 0.2)
    assert await d.get_session("gone") is None
    assert await d.release_session("gone") is False
    with pytest.raises(UnknownSession):
        await d.update_session(SessionRecord("gone", "dead"))
    moved = await d.get_session("moved")
    assert moved is not None and (moved.worker_id, moved.state) == ("alive", SessionState.ACTIVE)


async def test_a_deregistered_worker_s_sessions_lapse(harness: Harness) -> None:
    d = harness.with_orphan_ttl(ORPHAN_TTL)
    await add_worker(d, "w")
    await d.place_session("s", 1.0)
    assert await d.deregister_worker("w") == ["s"]
    await harness.elapse(ORPHAN_TTL + 0.2)
    assert await d.get_session("s") is None


async def test_a_late_write_from_a_removed_worker_does_not_keep_its_record(
    harness: Harness,
) -> None:
    d = harness.with_orphan_ttl(ORPHAN_TTL)
    await add_worker(d, "w")
    await d.place_session("s", 1.0)
    await d.deregister_worker("w")
    await harness.elapse(ORPHAN_TTL / 2)
    # A checkpoint the removed worker had in flight: active again, but on no worker.
    stored = await d.update_session(SessionRecord("s", "w", 1, 7, SessionState.ACTIVE))
    assert stored.state is SessionState.ACTIVE
    await harness.elapse(ORPHAN_TTL / 2 + 0.2)
    assert await d.get_session("s") is not None  # the write started the TTL again
    await harness.elapse(ORPHAN_TTL / 2)
    assert await d.get_session("s") is None


async def test_sessions_on_registered_workers_never_lapse(harness: Harness) -> None:
    d = harness.with_orphan_ttl(ORPHAN_TTL)
    await add_worker(d, "w", capacity=3)
    for sid in ("active", "migrating", "back"):
        await d.place_session(sid, 1.0)
    rec = await d.get_session("migrating")
    assert rec is not None
    await d.update_session(dataclasses.replace(rec, state=SessionState.MIGRATING))
    assert await d.orphan_sessions_of("w") == ["active", "back", "migrating"]
    # The worker is still registered and writes its sessions again: they are kept.
    for sid in ("active", "migrating"):
        await d.update_session(SessionRecord(sid, "w", 0, 3, SessionState.ACTIVE))
    await harness.elapse(ORPHAN_TTL + 0.2)
    assert (await d.get_session("active")).state is SessionState.ACTIVE  # type: ignore[union-attr]
    assert (await d.get_session("migrating")).block_idx == 3  # type: ignore[union-attr]
    assert await d.get_session("back") is None  # left orphaned: lapsed
    assert (await d.get_worker("w")).load == 2  # type: ignore[union-attr]


async def test_a_lapsed_session_is_placed_afresh(harness: Harness) -> None:
    d = harness.with_orphan_ttl(ORPHAN_TTL)
    await add_worker(d, "w")
    await d.place_session("s", 1.0)
    await d.update_session(SessionRecord("s", "w", epoch=3, block_idx=42))
    await d.orphan_sessions_of("w")
    await harness.elapse(ORPHAN_TTL + 0.2)
    await d.place_session("s", 1.0)
    rec = await d.get_session("s")
    assert rec is not None and (rec.epoch, rec.block_idx, rec.state) == (0, 0, SessionState.ACTIVE)


async def test_lapsed_records_nobody_reads_are_swept_from_memory() -> None:
    now = [1000.0]
    d = MemoryDirectory(clock=lambda: now[0], orphan_ttl_s=ORPHAN_TTL)
    await add_worker(d, "w", capacity=100)
    for i in range(50):
        await d.place_session(f"s{i}", 1.0)
    await d.deregister_worker("w")
    assert len(d._sessions) == 50
    now[0] += ORPHAN_TTL + 0.1
    await add_worker(d, "w2")
    await d.place_session("new", 1.0)  # any write sweeps
    assert list(d._sessions) == ["new"] and d._lapse == {}


def test_the_orphan_ttl_is_validated() -> None:
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="orphan_ttl_s"):
            MemoryDirectory(orphan_ttl_s=bad)
        with pytest.raises(ValueError, match="orphan_ttl_s"):
            RedisDirectory("redis://127.0.0.1:1/0", orphan_ttl_s=bad)
