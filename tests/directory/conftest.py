"""Fixtures for the directory tests: every contract test runs against both implementations.

``harness`` is parametrized over ``memory`` (a fake clock drives the TTLs) and ``redis`` (a
real ``redis-server`` started once per test session; real expiry, so ``elapse`` sleeps).
Each Redis test gets its own key prefix, so tests never see each other's records.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pytest

from worldserve.server.cluster.directory import Directory, MemoryDirectory
from worldserve.server.cluster.directory.redis import RedisDirectory


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A throwaway redis-server on a free loopback port, no persistence."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail(
            "redis-server is not on PATH: the directory tests need a real Redis. "
            "Install it with `apt-get install redis-server` (or run scripts/system-deps.sh)."
        )
    port = free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        while not _pong(port):
            if proc.poll() is not None:
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                pytest.fail(f"redis-server exited with {proc.returncode}:\n{out[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"redis-server did not answer PING on port {port} within 10 s")
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


@dataclass
class Harness:
    """One directory under test, plus how time passes for it."""

    kind: str
    directory: Directory
    clock: FakeClock
    redis_url: str | None = None
    prefix: str = ""
    _peers: list[Directory] = field(default_factory=list)

    async def elapse(self, seconds: float) -> None:
        """Let ``seconds`` pass for TTLs: the fake clock in memory, real time in Redis."""
        self.clock.advance(seconds)
        if self.kind == "redis":
            await asyncio.sleep(seconds)

    def peer(self) -> Directory:
        """Another client of the same directory (another router or worker process)."""
        if self.redis_url is None:
            return self.directory
        peer = RedisDirectory(self.redis_url, self.prefix, clock=self.clock)
        self._peers.append(peer)
        return peer

    def with_orphan_ttl(self, orphan_ttl_s: float) -> Directory:
        """A directory of this harness's kind whose orphaned records lapse after
        ``orphan_ttl_s`` (in memory a new, empty one on the same clock; in Redis another
        client of the same records)."""
        d: Directory
        if self.redis_url is None:
            d = MemoryDirectory(clock=self.clock, orphan_ttl_s=orphan_ttl_s)
        else:
            d = RedisDirectory(self.redis_url, self.prefix, clock=self.clock,
                               orphan_ttl_s=orphan_ttl_s)
        self._peers.append(d)
        return d

    def with_handover_ttl(self, handover_ttl_s: float, orphan_ttl_s: float = 60.0) -> Directory:
        """A directory of this harness's kind whose handed-over sessions give their slot
        back after ``handover_ttl_s`` (in memory a new, empty one on the same clock; in
        Redis another client of the same records)."""
        d: Directory
        if self.redis_url is None:
            d = MemoryDirectory(clock=self.clock, orphan_ttl_s=orphan_ttl_s,
                                handover_ttl_s=handover_ttl_s)
        else:
            d = RedisDirectory(self.redis_url, self.prefix, clock=self.clock,
                               orphan_ttl_s=orphan_ttl_s, handover_ttl_s=handover_ttl_s)
        self._peers.append(d)
        return d

    async def close(self) -> None:
        for d in [*self._peers, self.directory]:
            await d.close()


@pytest.fixture(params=["memory", "redis"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    clock = FakeClock()
    if request.param == "memory":
        h = Harness("memory", MemoryDirectory(clock=clock), clock)
    else:
        url = request.getfixturevalue("redis_url")
        prefix = f"test-{uuid.uuid4().hex[:12]}"
        h = Harness("redis", RedisDirectory(url, prefix, clock=clock), clock, url, prefix)
    try:
        yield h
    finally:
        await h.close()


@pytest.fixture
def directory(harness: Harness) -> Directory:
    return harness.directory
