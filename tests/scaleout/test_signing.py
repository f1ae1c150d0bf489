"""Hand-offs and worker records signed with the cluster secret; worker addresses the
cluster trusts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.scaleout.conftest import HandOver
from tests.scaleout.harness import cluster
from tests.server.harness import recv_type, send
from worldserve.protocol import Error, Resume
from worldserve.server.cluster.directory import MemoryDirectory, NoWorkerAvailable
from worldserve.server.cluster.router import RouterSettings, create_router
from worldserve.server.cluster.signing import (
    BadSignature,
    address_allowed,
    sign,
    sign_worker,
    verify,
    worker_trusted,
)


def test_a_signed_handoff_reads_back_only_with_the_secret_and_for_its_session() -> None:
    blob = b"a hand-off"
    signed = sign("s3cret-cluster", "sess-1", blob)
    assert signed != blob and verify("s3cret-cluster", "sess-1", signed) == blob
    with pytest.raises(BadSignature):
        verify("another-secret", "sess-1", signed)
    with pytest.raises(BadSignature):
        verify("s3cret-cluster", "sess-2", signed)  # not moved onto another session
    with pytest.raises(BadSignature):
        verify("s3cret-cluster", "sess-1", blob)  # a planted, unsigned one
    assert verify(None, "sess-1", signed) == blob  # a cluster without a secret reads both


def test_only_allowed_worker_addresses_pass() -> None:
    assert address_allowed("http://10.0.0.5:8000", frozenset())
    assert address_allowed("http://10.0.0.5:8000", frozenset({"10.0.0.5"}))
    assert address_allowed("http://10.0.0.5:8000", frozenset({"10.0.0.5:8000"}))
    assert not address_allowed("http://evil.example:8000", frozenset({"10.0.0.5"}))


async def test_a_handoff_planted_in_the_directory_takes_over_no_session(hand_over: HandOver) -> None:
    async with cluster(2, cluster_secret="cluster-secret-1") as c:
        moved = await hand_over(c)
        sid = moved.session_id
        data = await c.directory.get_snapshot(sid)
        assert data is not None
        tampered = verify("cluster-secret-1", sid, data)  # someone with Redis access rewrites it
        await c.directory.put_snapshot(sid, tampered, 60.0)
        async with c.http.ws_connect(moved.target_ws) as ws:
            await send(ws, Resume(sid, moved.token, 1))
            err = await recv_type(ws, Error)
            assert isinstance(err, Error) and err.code == "missing_session_state"


async def test_the_router_places_on_no_worker_outside_its_allowed_list() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from worldserve.server.cluster.directory import WorkerInfo, WorkerState

    directory = MemoryDirectory()
    planted = WorkerInfo("planted", "http://evil.example:80", WorkerState.SERVING, capacity=4)
    await directory.register_worker(planted, 30.0)
    settings = RouterSettings(maintenance_s=60.0, allowed_workers=frozenset({"127.0.0.1"}))
    async with TestClient(TestServer(create_router(settings, directory=directory), host="127.0.0.1")) as client:
        async with client.post("/v1/place") as resp:
            assert resp.status == 503
        assert await directory.get_session("x") is None


def test_a_worker_record_is_trusted_only_with_its_own_signature() -> None:
    from worldserve.server.cluster.directory import WorkerInfo, WorkerState

    info = WorkerInfo("w0", "http://10.0.0.5:8000", WorkerState.SERVING, instance="abc")
    signed = sign_worker("s3cret", info)
    assert worker_trusted(signed, "s3cret", frozenset())
    assert not worker_trusted(info, "s3cret", frozenset())  # unsigned
    assert not worker_trusted(signed, "another", frozenset())
    assert not worker_trusted(replace(signed, address="http://evil.example:80"), "s3cret", frozenset())
    assert worker_trusted(info, None, frozenset())  # a cluster without a secret trusts records as they are


async def test_the_router_places_no_session_on_an_unsigned_worker_record() -> None:
    from worldserve.server.cluster.directory import WorkerInfo, WorkerState
    from worldserve.server.cluster.router import Router

    directory = MemoryDirectory()
    planted = WorkerInfo("planted", "http://evil.example:80", WorkerState.SERVING, capacity=8)
    real = sign_worker("s3cret", WorkerInfo("real", "http://127.0.0.1:8001", WorkerState.SERVING, capacity=1,
                                            load=0, instance="i1"))
    await directory.register_worker(planted, 30.0)
    await directory.register_worker(real, 30.0)
    router = Router(RouterSettings(cluster_secret="s3cret"), directory)
    assert (await router.place())["worker_id"] == "real"  # the emptier planted one is passed over
    with pytest.raises(NoWorkerAvailable):
        await router.place()  # real is full; planted is never an answer
    await directory.place_session("moved", 1.0)  # a record pointing at the planted worker
    planted_rec = await directory.get_session("moved")
    assert planted_rec is not None and planted_rec.worker_id == "planted"
    assert await router.locate("moved") is None


async def test_a_cluster_with_a_secret_signs_its_worker_records() -> None:
    async with cluster(1, cluster_secret="cluster-secret-1") as c:
        (w,) = await c.directory.list_workers()
        assert w.instance and worker_trusted(w, "cluster-secret-1", frozenset())
        async with c.http.post(f"{c.router_url}/v1/place") as resp:
            assert resp.status == 200, await resp.text()
