"""A worker restarted within its TTL registers as another instance: the sessions its old
process held are orphaned (no slots, no squatting), while a re-registration of the same
process keeps them."""

from __future__ import annotations

import dataclasses

from tests.directory.conftest import Harness
from tests.directory.helpers import LONG_TTL
from worldserve.server.cluster.directory import SessionRecord, SessionState, WorkerInfo, WorkerState


def worker(instance: str) -> WorkerInfo:
    return WorkerInfo("a", "http://a.test:8000", WorkerState.SERVING, capacity=2, instance=instance)


async def test_a_worker_restarted_within_its_ttl_orphans_its_old_process_s_sessions(harness: Harness) -> None:
    d = harness.directory
    await d.register_worker(worker("first"), LONG_TTL)
    await d.place_session("old", 1.0)
    await d.update_session(SessionRecord("old", "a", 1, 7, SessionState.ACTIVE))
    await d.place_session("stale", 1.0, reserve_s=LONG_TTL)
    await d.register_worker(worker("first"), LONG_TTL)  # the same process again: nothing changes
    assert (await d.get_worker("a")).load == 2  # type: ignore[union-attr]
    await d.register_worker(worker("second"), LONG_TTL)  # a restart
    w = await d.get_worker("a")
    assert w is not None and w.load == 0 and w.instance == "second"
    rec = await d.get_session("old")
    assert rec is not None and rec.state is SessionState.ORPHANED and (rec.epoch, rec.block_idx) == (1, 7)
    assert not await d.claim_reservation("stale", "a")  # a known id cannot squat a slot
    assert [dataclasses.replace(x, heartbeat=0.0).instance for x in await d.list_workers()] == ["second"]
