"""A local deployment as separate processes: redis-server, a router and N workers on
loopback ports (the migration drill and the scale-out tests run one).

Every process gets its own session (process group) and log file, and ``stop()`` ends
them all (SIGTERM, then SIGKILL after a grace period), so nothing outlives the caller.
Workers run with one torch thread each (the CPU is shared with whatever else runs).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import aiohttp

ADMIN_KEY = "local-admin-key"


def serve_argv(*args: str) -> list[str]:
    """The command line of one ``worldserve serve`` with ``args``, in this Python."""
    return [sys.executable, "-m", "worldserve.cli", "serve", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    """One child process and its log."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path | None = None
    _log: IO[bytes] | None = None

    @classmethod
    def spawn(cls, name: str, argv: list[str], log_dir: Path | None, env: dict[str, str] | None = None) -> Proc:
        log = (log_dir / f"{name}.log").open("wb") if log_dir is not None else None
        popen = subprocess.Popen(
            argv,
            stdout=log if log is not None else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # its own process group: signals reach only it
        )
        return cls(name, popen, log_dir / f"{name}.log" if log_dir is not None else None, log)

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            with suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``grace_s``; returns the exit code."""
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait()
        self.close_log()
        return self.popen.returncode

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait()

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, chars: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]


@dataclass
class RedisProcess:
    """A throwaway redis-server on a loopback port, no persistence."""

    port: int
    proc: Proc

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def start(cls, port: int | None = None, log_dir: Path | None = None, timeout: float = 10.0) -> RedisProcess:
        exe = shutil.which("redis-server")
        if exe is None:
            raise FileNotFoundError(
                "redis-server is not on PATH: apt-get install redis-server (scripts/system-deps.sh)"
            )
        port = port or free_port()
        argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        proc = Proc.spawn("redis", argv, log_dir)
        deadline = time.monotonic() + timeout
        while not _pong(port):
            if not proc.alive:
                raise RuntimeError(f"redis-server exited with {proc.popen.returncode}: {proc.tail()}")
            if time.monotonic() > deadline:
                proc.stop()
                raise RuntimeError(f"redis-server did not answer PING on port {port}")
            time.sleep(0.02)
        return cls(port, proc)

    def stop(self) -> None:
        self.proc.stop(5.0)


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class LocalCluster:
    """redis (unless ``redis_url`` is given), a router and ``workers`` workers."""

    log_dir: Path
    weights: Path | None = None
    workers: int = 2
    redis_url: str | None = None
    fps: float = 4.0  # the ladder's floor for fps (sessions keep their fps under load)
    capacity: int = 8
    batch_sizes: str = "1,2,4,8"
    snapshot_interval_s: float = 1.0
    heartbeat_s: float = 0.5
    worker_ttl_s: float = 3.0
    drain_timeout_s: float = 30.0
    prefix: str = "worldserve"
    router_threshold: float = 100.0  # drills test the mechanism: place whatever the load
    extra_worker_args: list[str] = field(default_factory=list)
    redis: RedisProcess | None = None
    router: Proc | None = None
    procs: list[Proc] = field(default_factory=list)  # the workers
    ports: list[int] = field(default_factory=list)
    router_port: int = 0

    @property
    def directory_url(self) -> str:
        if self.redis_url is not None:
            return self.redis_url
        assert self.redis is not None
        return self.redis.url

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    def worker_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    def worker_id(self, i: int) -> str:
        return f"w{i}"

    def index_of(self, worker_id: str) -> int:
        return int(worker_id.lstrip("w"))

    def worker_argv(self, i: int) -> list[str]:
        port = self.ports[i]
        argv = [
            sys.executable, "-m", "worldserve.cli", "serve", "--port", str(port),
            "--directory-url", self.directory_url, "--directory-prefix", self.prefix,
            "--advertise", f"http://127.0.0.1:{port}", "--worker-id", self.worker_id(i),
            "--admin-key", ADMIN_KEY, "--threads", "1", "--buckets", "64",
            "--warmup-batch-sizes", self.batch_sizes, "--capacity", str(self.capacity),
            # Sessions keep their steps, fps and bucket (the ladder can only cut lookahead)
            # so a reference run with the same seeds and actions is comparable frame by frame.
            "--min-steps", "64", "--min-fps", str(self.fps), "--admission-threshold", "100",
            "--snapshot-interval-s", str(self.snapshot_interval_s),
            "--worker-heartbeat-s", str(self.heartbeat_s), "--worker-ttl-s", str(self.worker_ttl_s),
            "--drain-timeout-s", str(self.drain_timeout_s), "--placement-threshold", "100",
            "--log-level", "INFO",
        ]
        if self.weights is not None:
            argv += ["--weights", str(self.weights)]
        return argv + self.extra_worker_args

    async def start(self, timeout: float = 180.0) -> None:
        """Start everything and wait until every worker is ready and the router is."""
        env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.redis_url is None:
            self.redis = RedisProcess.start(log_dir=self.log_dir)
        self.ports = [free_port() for _ in range(self.workers)]
        self.router_port = free_port()
        for i in range(self.workers):
            self.procs.append(Proc.spawn(self.worker_id(i), self.worker_argv(i), self.log_dir, env))
        self.router = Proc.spawn("router", [
            sys.executable, "-m", "worldserve.cli", "router", "--port", str(self.router_port),
            "--directory-url", self.directory_url, "--directory-prefix", self.prefix,
            "--threshold", str(self.router_threshold),
        ], self.log_dir, env)
        urls = [f"{self.worker_url(i)}/readyz" for i in range(self.workers)]
        await wait_ready([*urls, f"{self.router_url}/readyz"], [*self.procs, self.router], timeout)

    async def drain(self, i: int) -> None:
        async with aiohttp.ClientSession() as http, http.post(
            f"{self.worker_url(i)}/admin/drain", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        ) as resp:
            if resp.status != 202:
                raise RuntimeError(f"drain of w{i} answered {resp.status}: {await resp.text()}")

    async def sessions_by_worker(self) -> dict[str, int]:
        """worker_id -> load, from the router."""
        async with aiohttp.ClientSession() as http, http.get(f"{self.router_url}/v1/workers") as resp:
            workers = (await resp.json())["workers"]
        return {w["worker_id"]: int(w["load"]) for w in workers}

    def stop(self) -> dict[str, int]:
        """End every process (workers first); returns their exit codes."""
        codes = {}
        for p in [*self.procs, *([self.router] if self.router else [])]:
            codes[p.name] = p.stop()
        if self.redis is not None:
            self.redis.stop()
        return codes

    async def __aenter__(self) -> LocalCluster:
        try:
            await self.start()
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()


async def wait_ready(urls: list[str], procs: list[Proc], timeout: float) -> None:
    """Wait for 200 from every url; fail early if a process exits."""
    deadline = time.monotonic() + timeout
    pending = list(urls)
    async with aiohttp.ClientSession() as http:
        while pending:
            for p in procs:
                if not p.alive:
                    raise RuntimeError(f"{p.name} exited with {p.popen.returncode}:\n{p.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready after {timeout:g} s: {pending}")
            for url in list(pending):
                try:
                    async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                        if resp.status == 200:
                            pending.remove(url)
                except (aiohttp.ClientError, TimeoutError):
                    pass
            if pending:
                await asyncio.sleep(0.2)
