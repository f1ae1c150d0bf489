"""The client installs and runs without torch or the server.

``pip install`` of the checkout with no extras is the client: numpy, msgpack, aiohttp and
Pillow. Importing the SDK loads nothing of the server, and a fresh virtual environment
with that install steers a real server (started from the project's environment) with
``clients/examples/steer.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Modules the client must never load: the server's dependencies, and the server's packages.
SERVER_ONLY = ("torch", "aiortc", "aioice", "av", "redis", "uvloop", "prometheus_client",
               "safetensors", "worldserve.server", "worldserve.session", "worldserve.model",
               "worldserve.training", "worldserve.world")
# Generic names an install must not claim: everything lives under `worldserve`.
GENERIC = ("cli", "server", "session", "model", "clients", "protocol", "bench", "training", "world")
# pip's words for an index it cannot reach.
NO_INDEX = ("NewConnectionError", "Network is unreachable", "Temporary failure in name resolution",
            "No matching distribution found", "Could not find a version")


def test_sdk_and_example_import_nothing_of_the_server() -> None:
    code = (
        "import json, sys\n"
        "import worldserve.clients.sdk, worldserve.clients.examples.steer, worldserve.protocol\n"
        "names = {m.split('.')[0] for m in sys.modules}\n"
        "names |= {'.'.join(m.split('.')[:2]) for m in sys.modules if m.startswith('worldserve.')}\n"
        "print(json.dumps(sorted(names)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    loaded = set(json.loads(out.stdout))
    assert {"worldserve.clients", "worldserve.protocol", "aiohttp", "msgpack", "numpy"} <= loaded
    assert not loaded & set(SERVER_ONLY), sorted(loaded & set(SERVER_ONLY))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise AssertionError(f"{url} did not answer 200 within {timeout} s")


@pytest.mark.slow
def test_fresh_venv_installs_the_client_alone_and_steers_a_server(tmp_path: Path) -> None:
    # The checkout as a user has it (what git tracks and the new files), built out of tree.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "runs",
        "out", "checkpoints"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    pip = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          str(src)], capture_output=True, text=True, timeout=600)
    if pip.returncode != 0:
        if any(word in pip.stdout + pip.stderr for word in NO_INDEX):
            pytest.skip(f"pip cannot reach a package index: {pip.stderr.strip()[-300:]}")
        raise AssertionError(pip.stdout + pip.stderr)

    probe = ("import importlib.util, json, sys; print(json.dumps("
             "{m: importlib.util.find_spec(m) is not None for m in sys.argv[1:]}))")
    found = json.loads(subprocess.run([str(py), "-c", probe, *SERVER_ONLY[:8]], capture_output=True, text=True,
                                      check=True, cwd=tmp_path).stdout)
    assert not any(found.values()), found  # no torch, aiortc, av, redis ... in the client's venv
    claimed = json.loads(subprocess.run([str(py), "-c", probe, *GENERIC], capture_output=True,
                                        text=True, check=True, cwd=tmp_path).stdout)
    assert not any(claimed.values()), claimed  # only the `worldserve` namespace is installed

    # The console script is there too, and says what serving needs.
    cli = subprocess.run([str(venv / "bin" / "worldserve"), "serve"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    assert cli.returncode != 0 and "worldserve[server]" in cli.stderr, cli.stderr[-2000:]

    port = _free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "worldserve.cli", "serve", "--port", str(port), "--capacity", "2",
             "--warmup-batch-sizes", "1", "--warmup-steps", "4"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            _wait_ready(f"http://127.0.0.1:{port}/readyz", server)
            out = tmp_path / "frames"
            steer = subprocess.run(
                [str(py), "-m", "worldserve.clients.examples.steer", "--url", f"ws://127.0.0.1:{port}/v1/ws",
                 "--frames", "8", "--fps", "8", "--out", str(out)],
                cwd=tmp_path, capture_output=True, text=True, timeout=240,
                env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
            )
            assert steer.returncode == 0, steer.stdout + steer.stderr
            assert "saved 8 frames" in steer.stdout
            assert len(list(out.glob("frame_*.png"))) == 8
            where = subprocess.run([str(py), "-c", "import worldserve.clients.sdk as m; print(m.__file__)"],
                                   capture_output=True, text=True, check=True, cwd=tmp_path).stdout
            assert str(venv) in where  # the installed copy ran, not the checkout
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGINT)
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(server.pid, signal.SIGKILL)
                    server.wait()
