"""The README's serve command, run as a user runs it: `bash scripts/serve.sh`."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import aiohttp

from worldserve.clients.sdk import WorldClient

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"serve.sh exited with {proc.returncode}")
            try:
                async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.25)
    raise AssertionError(f"{url} did not answer 200 within {timeout} s")


async def test_serve_script_answers_readyz_and_serves_a_session(
    model_weights: Path, tmp_path: Path
) -> None:
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    env = {**os.environ, "WORLDSERVE_PORT": str(port)}
    proc = subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "serve.sh"), "--weights", str(model_weights),
         "--warmup-batch-sizes", "1", "--warmup-steps", "4", "--capacity", "2"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        await wait_ready(f"http://127.0.0.1:{port}/readyz", proc)
        async with WorldClient(f"ws://127.0.0.1:{port}/v1/ws") as client:
            started = await client.start("a green forest", fps=8.0)
            for _ in range(3):
                ev = await client.next_frame(60)
                assert ev.image is not None and ev.image.shape[2] == 3
        assert started.protocol == 1
        proc.send_signal(signal.SIGINT)  # aiohttp's graceful shutdown
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    text = (tmp_path / "serve.log").read_text()
    assert "session started" in text and "sid=" in text, text[-2000:]
