"""Background writes of the cluster wing (directory records, store objects) that a session's
path does not wait for: each task is held until it is done, and a failure is logged, never
raised into the loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any


def spawn(tasks: set[asyncio.Task[None]], coro: Coroutine[Any, Any, None], log: logging.Logger, what: str,
          sid: str) -> None:
    """Run ``coro`` as a task held in ``tasks`` until it ends; if it fails, log ``what`` failed."""
    task = asyncio.create_task(coro)
    tasks.add(task)

    def done(t: asyncio.Task[None]) -> None:
        tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.warning("%s failed: %r", what, t.exception(), extra={"sid": sid})

    task.add_done_callback(done)
