"""The one polling helper of the test suite, for conditions no event announces."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


async def until(
    cond: Callable[[], bool | Awaitable[bool]], timeout: float = 30.0, what: str = "condition"
) -> None:
    """Return once ``cond()`` (sync or async) is true; TimeoutError after ``timeout`` s.
    Timeouts are generous limits for a loaded machine, never measurements."""
    end = time.monotonic() + timeout
    while True:
        ok = cond()
        if inspect.isawaitable(ok):
            ok = await ok
        if ok:
            return
        if time.monotonic() > end:
            raise TimeoutError(f"{what} not met within {timeout:g} s")
        await asyncio.sleep(0.02)
