"""Handoff blobs and the router's decisions, without servers."""

from __future__ import annotations

from dataclasses import replace

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.directory.conftest import FakeClock
from worldserve.protocol import Start
from worldserve.server.cluster.directory import (
    MemoryDirectory,
    NoWorkerAvailable,
    SessionRecord,
    SessionState,
    WorkerInfo,
    WorkerState,
)
from worldserve.server.cluster.router import Router, RouterSettings
from worldserve.session.handoff import VERSION, Handoff, HandoffError, ReplayBlock, decode
from worldserve.session.plan import ModelState
from worldserve.session.presentation import Presentation
from worldserve.session.session import Session, SessionConfig
from worldserve.session.snapshot import snapshot


def make_handoff(kind: str = "migration") -> tuple[Handoff, str]:
    session, token = Session.create(SessionConfig(fps=6.0, seed=5), scene="a forest")
    frames = np.arange(2 * 8 * 8 * 3, dtype=np.uint8).reshape(2, 8, 8, 3)
    state = ModelState(8, frames, 1, 9, np.arange(16, dtype=np.uint8), "a forest")
    h = Handoff(
        kind,  # type: ignore[arg-type]
        session.id, 0, 9, 1, Start("a forest", 5, 6.0, 64, "raw", lookahead=1),
        np.array([1, 0, 0, 0, 0.25, -0.5], np.float32), 7, 8,
        (ReplayBlock(8, 7, frames[1:]),), snapshot(session, state), 1_700_000_000.5,
    )
    return h, token


def test_a_handoff_round_trips_and_restores_its_session() -> None:
    h, token = make_handoff()
    back = decode(h.encode())
    assert (back.kind, back.session_id, back.next_block, back.level) == ("migration", h.session_id, 9, 1)
    assert back.request == h.request and back.created == h.created
    assert back.action is not None and np.array_equal(back.action, h.action)
    assert (back.action_seq, back.seen_seq) == (7, 8)
    assert [r.block_idx for r in back.replay] == [8]
    assert np.array_equal(back.replay[0].frames, h.replay[0].frames)
    session, state = back.restore()
    assert session.check_token(token) and session.id == h.session_id
    assert state.frame_index == 9 and state.sink_count == 1


def test_a_handoff_carries_the_presentation_clock_and_one_without_it_still_reads() -> None:
    h, _ = make_handoff()
    h = replace(h, replay=(replace(h.replay[0], pts_us=1_500_000, late=2),),
                presentation=Presentation(10, 1_666_666.5))
    back = decode(h.encode())
    assert back.presentation == Presentation(10, 1_666_666.5)
    assert (back.replay[0].pts_us, back.replay[0].late) == (1_500_000, 2)
    doc = msgpack.unpackb(h.encode())  # as written before the clock travelled with it
    del doc["presentation"]
    for r in doc["replay"]:
        del r["pts_us"], r["late"]
    old = decode(msgpack.packb(doc))
    assert old.presentation is None and (old.replay[0].pts_us, old.replay[0].late) == (None, 0)
    doc["presentation"] = [10, -1.0]
    with pytest.raises(HandoffError, match="presentation"):
        decode(msgpack.packb(doc))


def test_a_handoff_of_the_previous_version_still_reads_with_an_empty_input_budget() -> None:
    h, token = make_handoff()
    h = replace(h, inputs=1.5)
    assert decode(h.encode()).inputs == 1.5
    doc = msgpack.unpackb(h.encode())
    assert doc["version"] == VERSION == 2
    doc["version"] = 1  # as the release before wrote it: no input budget
    del doc["inputs"]
    old = decode(msgpack.packb(doc))
    assert old.inputs == 0.0 and old.next_block == h.next_block
    assert old.restore()[0].check_token(token)
    doc["inputs"] = 1.0  # version 1 had no such key
    with pytest.raises(HandoffError, match="keys"):
        decode(msgpack.packb(doc))


def test_a_handoff_never_carries_an_observation_or_an_api_key() -> None:
    h, _ = make_handoff()
    wire = msgpack.unpackb(h.encode())
    assert set(wire["request"]) >= {"prompt", "seed", "fps"}
    assert not {"observation", "api_key", "session_id", "type"} & set(wire["request"])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"version": 3}, "version"),
        ({"version": 0}, "version"),
        ({"inputs": -1.0}, "inputs"),
        ({"kind": "other"}, "kind"),
        ({"next_block": -1}, "next_block"),
        ({"session_id": "../x"}, "session_id"),
        ({"request": {"fps": 0}}, "request.fps"),
        ({"action": {"seq": 1, "seen": 1, "vec": b"123"}}, "action.vec"),
        ({"replay": [{"block": 1, "action_seq": 0, "shape": [1, 8, 8, 3], "data": b"x"}]}, "replay[0].data"),
        ({"snapshot": "text"}, "snapshot"),
        ({"extra": 1}, "keys"),
    ],
)
def test_a_bad_handoff_is_refused_naming_the_field(change: dict[str, object], field: str) -> None:
    h, _ = make_handoff()
    doc = msgpack.unpackb(h.encode())
    doc.update(change)
    with pytest.raises(HandoffError, match=field.replace("[", r"\[").replace("]", r"\]")):
        decode(msgpack.packb(doc))


def test_a_handoff_whose_snapshot_is_of_another_session_does_not_restore() -> None:
    h, _ = make_handoff()
    other, _ = make_handoff()
    doc = msgpack.unpackb(h.encode())
    doc["snapshot"] = other.snapshot
    with pytest.raises(HandoffError, match="snapshot is of session"):
        decode(msgpack.packb(doc)).restore()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=512), st.integers(0, 2000))
def test_garbage_and_truncated_handoffs_raise_only_handoff_error(junk: bytes, cut: int) -> None:
    h, _ = make_handoff()
    for data in (junk, h.encode()[:cut]):
        try:
            decode(data).restore()
        except HandoffError:
            pass


async def test_the_router_re_places_a_dead_worker_s_session_only_with_a_snapshot() -> None:
    clock = FakeClock()
    d = MemoryDirectory(clock=clock)
    router = Router(RouterSettings(), d)
    for wid in ("a", "b"):
        await d.register_worker(WorkerInfo(wid, f"http://{wid}:1", WorkerState.SERVING, 4), 3.0)
    placed = await router.place()
    first = placed["worker_id"]
    other = "b" if first == "a" else "a"
    assert (await router.locate(placed["session_id"]))["worker_id"] == first  # type: ignore[index]
    bare = await router.place()  # a second session on the other worker... or the same
    clock.advance(2.0)
    await d.heartbeat(other, 0, 0.0, WorkerState.SERVING, 3.0)
    clock.advance(2.0)  # `first` missed its heartbeats: dead
    await d.put_snapshot(placed["session_id"], b"snap", 60.0)
    moved = await router.locate(placed["session_id"])
    assert moved is not None and moved["worker_id"] == other and moved["url"] == f"ws://{other}:1/v1/ws"
    rec = await d.get_session(placed["session_id"])
    # A handover to `other`: its slot is held until the client resumes there (it writes
    # the record active) or the handover TTL runs out.
    assert rec is not None and rec.worker_id == other and rec.state is SessionState.MIGRATING
    if bare["worker_id"] == first:  # died with its worker, and no snapshot to restore from
        assert await router.locate(bare["session_id"]) is None
    assert await router.locate("never-seen") is None


async def test_a_re_placed_session_its_client_never_resumes_frees_the_slot() -> None:
    clock = FakeClock()
    d = MemoryDirectory(clock=clock, handover_ttl_s=5.0)
    router = Router(RouterSettings(handover_ttl_s=5.0), d)
    await d.register_worker(WorkerInfo("dead", "http://dead:1", WorkerState.SERVING, 1), 1.0)
    sid = (await router.place())["session_id"]
    await d.update_session(SessionRecord(sid, "dead", 1, 12, SessionState.ACTIVE))
    await d.put_snapshot(sid, b"snap", 600.0)
    await d.register_worker(WorkerInfo("live", "http://live:1", WorkerState.SERVING, 1), 60.0)
    clock.advance(2.0)  # "dead" missed its heartbeats
    assert (await router.locate(sid))["worker_id"] == "live"  # type: ignore[index]
    assert (await d.get_worker("live")).load == 1  # type: ignore[union-attr]
    with pytest.raises(NoWorkerAvailable):
        await router.place()
    clock.advance(5.1)  # nobody resumed there
    await router.maintain()
    rec = await d.get_session(sid)
    assert rec is not None and (rec.worker_id, rec.state) == ("live", SessionState.ORPHANED)
    assert (rec.epoch, rec.block_idx) == (1, 12)
    assert (await d.get_worker("live")).load == 0  # type: ignore[union-attr]
    assert (await router.place())["worker_id"] == "live"


async def test_a_reservation_no_worker_took_up_is_released_by_the_directory_even_without_its_router() -> None:
    clock = FakeClock()
    d = MemoryDirectory(clock=clock)
    router = Router(RouterSettings(reservation_ttl_s=5.0), d)
    await d.register_worker(WorkerInfo("a", "http://a:1", WorkerState.SERVING, 2), 30.0)
    taken, unused = await router.place(), await router.place()
    del router  # a router restart: nothing of the reservations was in its memory
    assert await d.claim_reservation(taken["session_id"], "a")
    clock.advance(5.1)
    assert await d.get_session(unused["session_id"]) is None
    assert await d.get_session(taken["session_id"]) is not None
    assert (await d.get_worker("a")).load == 1  # type: ignore[union-attr]
