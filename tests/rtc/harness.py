"""A server with WebRTC on a loopback port, for tests/rtc and tests/browser."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.server.harness import TEST_SETTINGS, fake_factory
from worldserve.server.app import load_model_runner
from worldserve.server.cluster.worker import create_worker
from worldserve.server.keys import SERVICE
from worldserve.server.prompt_filter import PromptChecks
from worldserve.server.rtc import RtcSettings, setup_rtc
from worldserve.server.rtc.keys import RTC_SETTINGS
from worldserve.server.settings import Settings
from worldserve.session.plan import Runner


def rss_bytes() -> int:
    """This process's resident set size (Linux)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def with_rtc(app: web.Application, rtc: RtcSettings) -> None:
    """WebRTC on ``app`` with ``rtc`` (whether or not create_worker already set it up)."""
    if RTC_SETTINGS in app:
        app[RTC_SETTINGS] = rtc
    else:
        setup_rtc(app, rtc)


@asynccontextmanager
async def serve_rtc(
    settings: Settings = TEST_SETTINGS,
    runner_factory: Callable[[Settings], Runner] | None = None,
    rtc: RtcSettings | None = None,
    *,
    ready_timeout: float = 180.0,
    prompt_checks: PromptChecks | None = None,
    **overrides: object,
) -> AsyncIterator[tuple[web.Application, str]]:
    """(app, base URL) of a ready server (``prompt_checks``: as tests/server/harness.py's)."""
    if overrides:
        settings = replace(settings, **overrides)  # type: ignore[arg-type]
    app = create_worker(settings, runner_factory=runner_factory or fake_factory(), prompt_checks=prompt_checks)
    with_rtc(app, rtc or RtcSettings())
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        deadline = time.monotonic() + ready_timeout
        while not app[SERVICE].ready:
            if app[SERVICE].failure:
                raise RuntimeError(app[SERVICE].failure)
            if time.monotonic() > deadline:
                raise TimeoutError("server did not become ready")
            await asyncio.sleep(0.02)
        yield app, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


def model_settings(weights: Path, bucket: int = 64, **kw: object) -> dict[str, object]:
    """Settings overrides for a server on the real model (as tests/server/test_e2e_model.py)."""
    out: dict[str, object] = dict(
        weights=weights,
        threads=1,
        buckets=(bucket,),
        warmup_batch_sizes=(1, 2),
        warmup_steps=(4,),
        # Admit even when a training job shares the CPU (the cost model is measured under
        # that load); sessions still degrade on the ladder.
        admission_threshold=4.0,
        capacity=4,
        runner_factory=load_model_runner,
    )
    out.update(kw)
    return out
