"""What only the Redis directory has: an unreachable server, shared records, the factory."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio as aioredis

from tests.directory.conftest import free_port
from tests.polling import until
from worldserve.server.cluster.directory import (
    Directory,
    DirectoryUnavailable,
    MemoryDirectory,
    SessionRecord,
    SessionState,
    WorkerInfo,
    WorkerState,
    open_directory,
)
from worldserve.server.cluster.directory.redis import RedisDirectory

OPERATIONS: dict[str, Callable[[Directory], Awaitable[object]]] = {
    "register_worker": lambda d: d.register_worker(WorkerInfo("w", "http://w:1"), 5.0),
    "heartbeat": lambda d: d.heartbeat("w", 0, 0.0, WorkerState.SERVING, 5.0),
    "list_workers": lambda d: d.list_workers(),
    "place_session": lambda d: d.place_session("s", 1.0),
    "get_session": lambda d: d.get_session("s"),
    "update_session": lambda d: d.update_session(SessionRecord("s", "w")),
    "put_snapshot": lambda d: d.put_snapshot("s", b"x", 5.0),
    "reap_dead_workers": lambda d: d.reap_dead_workers(),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
async def test_unreachable_redis_raises_directory_unavailable_promptly(operation: str) -> None:
    port = free_port()  # nothing listens there once the probe socket is closed
    d = RedisDirectory(f"redis://:hunter2@127.0.0.1:{port}/0", socket_timeout_s=0.5)
    try:
        start = time.monotonic()
        with pytest.raises(DirectoryUnavailable) as err:
            await OPERATIONS[operation](d)
        assert time.monotonic() - start < 2.0
    finally:
        await d.close()
    message = str(err.value)
    assert operation in message and f"127.0.0.1:{port}" in message
    assert "hunter2" not in message
    assert err.value.code == "directory_unavailable"


async def test_a_worker_registered_by_one_client_is_placed_by_another(redis_url: str) -> None:
    worker = RedisDirectory(redis_url, "shared-test")
    router = RedisDirectory(redis_url, "shared-test")
    other = RedisDirectory(redis_url, "other-prefix")
    try:
        await worker.register_worker(
            WorkerInfo("w", "http://w:1", state=WorkerState.SERVING, capacity=1), 5.0
        )
        assert (await router.place_session("s", 1.0)).address == "http://w:1"
        assert await other.list_workers() == []
        assert (await worker.get_session("s")).worker_id == "w"  # type: ignore[union-attr]
    finally:
        for d in (worker, router, other):
            await d.close()


async def test_corrupt_records_raise_directory_unavailable(redis_url: str) -> None:
    raw = aioredis.Redis.from_url(redis_url)
    d = RedisDirectory(redis_url, "corrupt-test")
    try:
        await raw.hset("{corrupt-test}:session:s", mapping={"worker_id": "w", "epoch": "x"})
        with pytest.raises(DirectoryUnavailable, match="corrupt record for session 's'"):
            await d.get_session("s")
    finally:
        await d.close()
        await raw.aclose()


async def test_open_directory_picks_the_implementation_from_the_url() -> None:
    assert isinstance(open_directory(None), MemoryDirectory)
    assert isinstance(open_directory("memory://"), MemoryDirectory)
    d = open_directory("redis://127.0.0.1:1/0")
    assert isinstance(d, RedisDirectory)
    await d.close()
    with pytest.raises(ValueError, match="'http'"):
        open_directory("http://example.test")


async def test_orphaned_session_keys_carry_the_orphan_ttl_in_redis(redis_url: str) -> None:
    raw = aioredis.Redis.from_url(redis_url)
    d = open_directory(redis_url, prefix="orphan-ttl-test", orphan_ttl_s=120.0)
    key = "{orphan-ttl-test}:session:s"
    try:
        await d.register_worker(WorkerInfo("w", "http://w:1", WorkerState.SERVING, 2), 5.0)
        await d.place_session("s", 1.0)
        assert await raw.pttl(key) == -1  # on a registered worker: no expiry
        await d.deregister_worker("w")
        assert 119_000 < await raw.pttl(key) <= 120_000
        await d.register_worker(WorkerInfo("w2", "http://w2:1", WorkerState.SERVING, 2), 5.0)
        await d.place_session("s", 1.0)
        assert await raw.pttl(key) == -1  # placed again: kept
    finally:
        await d.close()
        await raw.aclose()


async def test_an_expired_handover_leaves_the_worker_s_session_set(redis_url: str) -> None:
    """The handover key's TTL alone would leave the id in the worker's set (its load):
    the router's periodic reap takes it out, with no read of the session or the worker."""
    raw = aioredis.Redis.from_url(redis_url)
    d = RedisDirectory(redis_url, "handover-ttl-test", orphan_ttl_s=120.0, handover_ttl_s=2.0)
    b = "{handover-ttl-test}"
    try:
        await d.register_worker(WorkerInfo("w", "http://w:1", WorkerState.SERVING, 3), 30.0)
        for sid in ("kept", "resumed", "left"):
            await d.place_session(sid, 1.0)
            await d.update_session(SessionRecord(sid, "w", 1, 9, SessionState.MIGRATING))
        assert 1000 < await raw.pttl(f"{b}:handover:left") <= 2000
        assert await raw.pttl(f"{b}:session:left") == -1  # on a registered worker: kept
        assert await raw.smembers(f"{b}:worker-handovers:w") == {b"kept", b"resumed", b"left"}
        await d.update_session(SessionRecord("resumed", "w", 1, 10, SessionState.ACTIVE))
        assert await raw.exists(f"{b}:handover:resumed") == 0
        assert await raw.smembers(f"{b}:worker-handovers:w") == {b"kept", b"left"}
        await asyncio.sleep(1.0)  # half the handovers' time
        await d.update_session(SessionRecord("kept", "w", 1, 9, SessionState.MIGRATING))

        async def ran_out() -> bool:  # "left" runs out a second before "kept", written again
            return await raw.exists(f"{b}:handover:left") == 0

        await until(ran_out, what='"left" running out')
        assert b"left" in await raw.smembers(f"{b}:worker-sessions:w")  # not yet swept
        assert await d.reap_dead_workers() == {}
        assert await raw.smembers(f"{b}:worker-sessions:w") == {b"kept", b"resumed"}
        assert await raw.smembers(f"{b}:worker-handovers:w") == {b"kept"}
        assert await raw.hget(f"{b}:session:left", "state") == b"orphaned"
        assert 119_000 < await raw.pttl(f"{b}:session:left") <= 120_000
        assert await raw.hget(f"{b}:session:kept", "state") == b"migrating"
    finally:
        await d.close()
        await raw.aclose()


async def test_a_draining_worker_s_handover_ttl_reaches_redis(redis_url: str) -> None:
    raw = aioredis.Redis.from_url(redis_url)
    d = open_directory(redis_url, prefix="handover-open-test", handover_ttl_s=45.0)
    try:
        await d.register_worker(WorkerInfo("w", "http://w:1", WorkerState.SERVING, 2), 5.0)
        await d.place_session("s", 1.0)
        await d.update_session(SessionRecord("s", "w", 0, 3, SessionState.MIGRATING))
        assert 44_000 < await raw.pttl("{handover-open-test}:handover:s") <= 45_000
    finally:
        await d.close()
        await raw.aclose()
