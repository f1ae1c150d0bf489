"""``RedisDirectory``: the directory shared by workers and routers on many machines.

Keys (``B`` is ``{prefix}``: the braces are a Redis Cluster hash tag, so every key of one
directory lands in one slot and the Lua scripts may touch keys they compute)::

    B:workers                 set of registered worker ids
    B:worker:<id>             hash: address state capacity load utilisation heartbeat instance
                              signature
    B:alive:<id>              "1" with the heartbeat TTL; the worker is live while it exists
    B:worker-sessions:<id>    set of session ids holding a slot on the worker
    B:worker-handovers:<id>   the members of worker-sessions:<id> that are handed over
                              (migrating) or reserved, each waiting on its handover key
    B:session:<sid>           hash: worker_id epoch block_idx state updated; with the orphan
                              TTL while its worker is gone (orphaned, or not registered)
    B:handover:<sid>          "1" with the handover TTL, while a handed-over session holds
                              its slot; once it is gone the session is orphaned (a
                              reservation, held the same way with its own TTL, is deleted)
    B:snapshot:<sid>          the snapshot bytes, with their TTL

Every operation that reads and then writes is one Lua script (server/cluster/directory/lua.py),
so it is atomic: two routers placing at once can never both take a worker's last slot. Numbers travel as decimal strings
(Lua would truncate a float reply to an integer). Any Redis or socket error becomes
``DirectoryUnavailable``; short socket timeouts make that prompt.

An expired handover key does not by itself give the slot back (the session id stays in
``worker-sessions``): every script that reads a worker's load or a session record first
orphans the handovers whose key is gone (``expire_handovers``), and
``reap_dead_workers``, which routers call every second, does it for every worker.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Collection
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError

from worldserve.server.cluster.directory import lua
from worldserve.server.cluster.directory.base import (
    Clock,
    NoWorkerAvailable,
    SessionRecord,
    SessionState,
    UnknownSession,
    UnknownWorker,
    WorkerInfo,
    WorkerState,
    check_heartbeat,
    check_threshold,
    check_ttl,
)
from worldserve.server.remote import HANDOVER_TTL_S, ORPHAN_TTL_S, DirectoryUnavailable

T = TypeVar("T")


class RedisDirectory:
    def __init__(
        self,
        url: str,
        prefix: str = "worldserve",
        *,
        clock: Clock = time.time,
        socket_timeout_s: float = 1.0,
        retries: int = 1,
        retry_after_s: float = 1.0,
        orphan_ttl_s: float = ORPHAN_TTL_S,
        handover_ttl_s: float = HANDOVER_TTL_S,
    ) -> None:
        check_ttl(orphan_ttl_s, "orphan_ttl_s")
        check_ttl(handover_ttl_s, "handover_ttl_s")
        parts = urlsplit(url)
        # Never put a password in an error message.
        self._where = f"{parts.scheme}://{parts.hostname or ''}:{parts.port or 6379}{parts.path}"
        self._base = "{" + prefix + "}"
        self._clock = clock
        self._retry_after_s = retry_after_s
        self._orphan_ttl_ms = _ms(orphan_ttl_s)
        self._handover_ttl_ms = _ms(handover_ttl_s)
        self._redis = aioredis.Redis.from_url(
            url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.05), retries),
        )
        self._register = self._script(lua.REGISTER)
        self._heartbeat = self._script(lua.HEARTBEAT)
        self._set_state = self._script(lua.SET_STATE)
        self._deregister = self._script(lua.DEREGISTER)
        self._orphan = self._script(lua.ORPHAN)
        self._reap = self._script(lua.REAP)
        self._list = self._script(lua.LIST)
        self._place = self._script(lua.PLACE)
        self._release = self._script(lua.RELEASE)
        self._claim = self._script(lua.CLAIM)
        self._recreate = self._script(lua.RECREATE)
        self._get = self._script(lua.GET)
        self._update = self._script(lua.UPDATE)

    # Workers.

    async def register_worker(self, info: WorkerInfo, ttl_s: float) -> None:
        check_ttl(ttl_s)
        await self._call(
            "register_worker",
            self._register,
            info.worker_id,
            info.address,
            str(WorkerState(info.state)),
            info.capacity,
            info.load,
            repr(float(info.utilisation)),
            self._now(),
            _ms(ttl_s),
            info.instance,
            self._orphan_ttl_ms,
            info.signature,
        )

    async def heartbeat(
        self,
        worker_id: str,
        load: int,
        utilisation: float,
        state: WorkerState,
        ttl_s: float,
    ) -> None:
        check_heartbeat(load, utilisation, state, ttl_s)
        found = await self._call(
            "heartbeat",
            self._heartbeat,
            worker_id,
            load,
            repr(float(utilisation)),
            str(WorkerState(state)),
            self._now(),
            _ms(ttl_s),
        )
        if not found:
            raise UnknownWorker(worker_id)

    async def set_worker_state(self, worker_id: str, state: WorkerState) -> None:
        found = await self._call(
            "set_worker_state", self._set_state, worker_id, str(WorkerState(state))
        )
        if not found:
            raise UnknownWorker(worker_id)

    async def deregister_worker(self, worker_id: str) -> list[str]:
        sids = await self._call(
            "deregister_worker", self._deregister, worker_id, self._now(), self._orphan_ttl_ms
        )
        return [_str(s) for s in sids]

    async def get_worker(self, worker_id: str) -> WorkerInfo | None:
        found = _workers(await self._call(
            "get_worker", self._list, self._now(), self._orphan_ttl_ms, worker_id
        ))
        return found[0] if found else None

    async def list_workers(self) -> list[WorkerInfo]:
        return _workers(
            await self._call("list_workers", self._list, self._now(), self._orphan_ttl_ms)
        )

    async def reap_dead_workers(self) -> dict[str, list[str]]:
        flat = await self._call("reap_dead_workers", self._reap, self._now(), self._orphan_ttl_ms)
        return {_str(flat[i]): [_str(s) for s in flat[i + 1]] for i in range(0, len(flat), 2)}

    # Sessions.

    async def place_session(
        self, session_id: str, threshold: float, *, reserve_s: float | None = None,
        among: Collection[str] | None = None,
    ) -> WorkerInfo:
        check_threshold(threshold)
        if reserve_s is not None:
            check_ttl(reserve_s, "reserve_s")
        reply = await self._call(
            "place_session",
            self._place,
            session_id,
            repr(float(threshold)),
            self._now(),
            self._orphan_ttl_ms,
            "" if reserve_s is None else _ms(reserve_s),
            "" if among is None else "\0".join(sorted(among)) or "\0",  # "\0": none
        )
        if reply[0] == 0:
            raise NoWorkerAvailable(self._retry_after_s, int(reply[1]), int(reply[2]))
        return _worker(_str(reply[1]), int(reply[2]), reply[3])

    async def claim_reservation(self, session_id: str, worker_id: str) -> bool:
        return bool(await self._call("claim_reservation", self._claim, session_id, worker_id,
                                     self._now(), self._orphan_ttl_ms))

    async def release_session(self, session_id: str) -> bool:
        return bool(await self._call("release_session", self._release, session_id))

    async def get_session(self, session_id: str) -> SessionRecord | None:
        flat = await self._call(
            "get_session", self._get, session_id, self._now(), self._orphan_ttl_ms
        )
        fields = {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}
        return _session(session_id, fields) if fields else None

    async def update_session(self, record: SessionRecord) -> SessionRecord:
        now = self._now()
        reply = await self._call(
            "update_session",
            self._update,
            record.session_id,
            record.worker_id,
            record.epoch,
            record.block_idx,
            str(SessionState(record.state)),
            now,
            self._orphan_ttl_ms,
            self._handover_ttl_ms,
            record.token_hash,
        )
        if reply[0] == 0:
            raise UnknownSession(record.session_id)
        if reply[0] == -1:
            raise ValueError(
                f"session {record.session_id!r} is on worker {_str(reply[1])!r}, not "
                f"{record.worker_id!r}: move it with place_session"
            )
        return SessionRecord(
            record.session_id,
            record.worker_id,
            epoch=record.epoch,
            block_idx=record.block_idx,
            state=SessionState(record.state),
            updated=float(now),
            token_hash=record.token_hash,
        )

    async def recreate_session(self, record: SessionRecord) -> bool:
        return bool(await self._call(
            "recreate_session", self._recreate, record.session_id, record.worker_id, record.epoch,
            record.block_idx, self._now(), record.token_hash, self._orphan_ttl_ms,
        ))

    async def orphan_sessions_of(self, worker_id: str) -> list[str]:
        sids = await self._call(
            "orphan_sessions_of", self._orphan, worker_id, self._now(), self._orphan_ttl_ms
        )
        return [_str(s) for s in sids]

    # Snapshots.

    async def put_snapshot(self, session_id: str, data: bytes, ttl_s: float) -> None:
        check_ttl(ttl_s)
        key = self._key("snapshot", session_id)
        await self._run("put_snapshot", self._redis.set(key, bytes(data), px=_ms(ttl_s)))

    async def get_snapshot(self, session_id: str) -> bytes | None:
        data = await self._run("get_snapshot", self._redis.get(self._key("snapshot", session_id)))
        if data is None or isinstance(data, bytes):
            return data
        raise DirectoryUnavailable(f"snapshot of {session_id!r} came back as {type(data).__name__}")

    async def delete_snapshot(self, session_id: str) -> bool:
        n = await self._run(
            "delete_snapshot", self._redis.delete(self._key("snapshot", session_id))
        )
        return bool(n)

    async def close(self) -> None:
        await self._redis.aclose()

    # Plumbing.

    def _script(self, body: str) -> Any:
        return self._redis.register_script(lua.PRELUDE + body)

    def _key(self, kind: str, ident: str) -> str:
        return f"{self._base}:{kind}:{ident}"

    def _now(self) -> str:
        return repr(float(self._clock()))

    async def _call(self, what: str, script: Any, *args: object) -> Any:
        return await self._run(what, script(args=[self._base, *args]))

    async def _run(self, what: str, pending: Awaitable[T]) -> T:
        try:
            return await pending
        except (RedisError, OSError) as exc:  # TimeoutError is an OSError
            raise DirectoryUnavailable(
                f"{what} failed at {self._where}: {type(exc).__name__}: {exc}"
            ) from exc


# Decoding replies: bytes in, records out. A record that does not parse means something
# else wrote under our prefix; refuse rather than guess.


def _str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _workers(flat: list[Any]) -> list[WorkerInfo]:
    return [_worker(_str(flat[i]), int(flat[i + 1]), flat[i + 2]) for i in range(0, len(flat), 3)]


def _worker(worker_id: str, placed: int, flat_hash: list[Any]) -> WorkerInfo:
    h = {_str(flat_hash[i]): _str(flat_hash[i + 1]) for i in range(0, len(flat_hash), 2)}
    try:
        return WorkerInfo(
            worker_id,
            h["address"],
            state=WorkerState(h["state"]),
            capacity=int(h["capacity"]),
            load=max(int(h["load"]), placed),
            utilisation=float(h["utilisation"]),
            heartbeat=float(h["heartbeat"]),
            instance=h.get("instance", ""),
            signature=h.get("signature", ""),
        )
    except (KeyError, ValueError) as exc:
        raise DirectoryUnavailable(f"corrupt record for worker {worker_id!r}: {exc!r}") from exc


def _session(session_id: str, fields: dict[Any, Any]) -> SessionRecord:
    h = {_str(k): _str(v) for k, v in fields.items()}
    try:
        return SessionRecord(
            session_id,
            h["worker_id"],
            epoch=int(h["epoch"]),
            block_idx=int(h["block_idx"]),
            state=SessionState(h["state"]),
            updated=float(h["updated"]),
            token_hash=h.get("token_hash", ""),
        )
    except (KeyError, ValueError) as exc:
        raise DirectoryUnavailable(f"corrupt record for session {session_id!r}: {exc!r}") from exc


def _ms(ttl_s: float) -> int:
    return max(1, round(ttl_s * 1000))
