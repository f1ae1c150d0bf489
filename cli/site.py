"""Running an aiohttp app until a signal: what ``serve`` and ``router`` share.

SIGINT stops at once; SIGTERM calls ``drain`` when one is given (the worker hands its
sessions over, then sets ``drained``), else stops as SIGINT does.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from aiohttp import web


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when it is installed, else asyncio's."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


async def run_site(
    app: web.Application,
    host: str,
    port: int,
    drained: asyncio.Event | None = None,
    drain: Callable[[], object] | None = None,
) -> None:
    """Serve ``app`` until SIGINT (or ``drained`` is set); SIGTERM calls ``drain``."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=10.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGTERM, drain if drain is not None else stop.set)
        waits = [asyncio.ensure_future(stop.wait())]
        if drained is not None:
            waits.append(asyncio.ensure_future(drained.wait()))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
    finally:
        await runner.cleanup()
