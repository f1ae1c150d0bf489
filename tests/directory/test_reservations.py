"""A router's reservation lives in the directory: it holds its slot for its TTL, its
worker claims it once, and one nobody claims is deleted without any router's help."""

from __future__ import annotations

import pytest

from tests.directory.conftest import Harness
from tests.directory.helpers import add_worker
from worldserve.server.cluster.directory import NoWorkerAvailable, SessionState

RESERVE_S = 1.5  # real seconds on Redis
MARGIN = 0.5


async def test_a_reservation_holds_its_slot_and_is_claimed_once_by_its_worker(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "a", capacity=1)
    assert (await d.place_session("r", 1.0, reserve_s=RESERVE_S)).load == 1
    rec = await d.get_session("r")
    assert rec is not None and rec.state is SessionState.RESERVED
    with pytest.raises(NoWorkerAvailable):
        await d.place_session("other", 1.0)
    assert not await d.claim_reservation("r", "b")  # not its worker
    assert await d.claim_reservation("r", "a")
    assert not await d.claim_reservation("r", "a")  # single use
    rec = await d.get_session("r")
    assert rec is not None and rec.state is SessionState.ACTIVE
    await harness.elapse(RESERVE_S + MARGIN)  # claimed: it no longer lapses
    assert (await d.get_worker("a")).load == 1  # type: ignore[union-attr]
    assert await d.get_session("r") is not None


async def test_a_reservation_nobody_claims_is_deleted_and_gives_its_slot_back(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "a", capacity=1)
    await d.place_session("r", 1.0, reserve_s=RESERVE_S)
    await harness.elapse(RESERVE_S + MARGIN)
    assert await d.reap_dead_workers() == {}
    assert await d.get_session("r") is None
    assert (await d.get_worker("a")).load == 0  # type: ignore[union-attr]
    assert not await d.claim_reservation("r", "a")
    assert (await d.place_session("next", 1.0)).worker_id == "a"


async def test_placement_among_given_workers_only(harness: Harness) -> None:
    d = harness.directory
    await add_worker(d, "a")
    await add_worker(d, "b", load=3)
    assert (await d.place_session("s", 1.0, among={"b"})).worker_id == "b"
    with pytest.raises(NoWorkerAvailable) as none:
        await d.place_session("t", 1.0, among=set())
    assert (none.value.live, none.value.serving) == (2, 0)  # live, none of them serving for it
