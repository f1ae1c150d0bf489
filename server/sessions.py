"""The sessions of one worker: the store's records and the server's ``Live`` beside each.

``Sessions`` owns both halves and keeps them in step. The ``SessionStore``
(session/store.py) decides identity and lifetime (ids, resume tokens, capacity, block_idx
epochs, detach/resume, the detached TTL); the ``Live`` table holds what the server keeps
per session (its request, peer, ring of recent blocks, applied action ...).

A session leaves through the store, whatever the reason (closed, evicted, expired): the
store's ``on_dispose`` lands in ``_disposed``, which drops its ``Live``, takes it out of
the engine, tells its peer ``ended`` with the reason and the directory (``Remote``) that
it ended, and counts it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from worldserve.protocol import CloseCode, Ended
from worldserve.server.engine import Suspension
from worldserve.server.gate import Gate
from worldserve.server.live import Live
from worldserve.server.metrics import Metrics
from worldserve.server.settings import Settings
from worldserve.session.errors import SessionStateMissing
from worldserve.session.store import SessionStore

log = logging.getLogger("worldserve.service")


class Sessions:
    """The store and the ``Live`` table of one worker; see the module docstring."""

    def __init__(self, settings: Settings, metrics: Metrics, clock: Callable[[], float], gate: Gate) -> None:
        self.metrics = metrics
        self.gate = gate
        self.store = SessionStore(
            settings.capacity,
            settings.detached_ttl_s,
            clock=clock,
            on_dispose=self._disposed,
            retry_after_s=settings.admission_retry_after_s,
            log_capacity=settings.log_capacity,
            log_frame_bytes=settings.log_frame_bytes,
            max_token_age_s=settings.max_token_age_s,
        )
        self._live: dict[str, Live] = {}
        self._evicted_seen = 0

    def get(self, sid: str) -> Live | None:
        return self._live.get(sid)

    def attached(self, sid: str) -> Live:
        """The session's ``Live`` if a transport is attached to it; else SessionStateMissing."""
        live = self._live.get(sid)
        if live is None or live.peer is None:
            raise SessionStateMissing(sid)
        return live

    def add(self, live: Live) -> None:
        self._live[live.sid] = live

    def __contains__(self, sid: str) -> bool:
        return sid in self._live

    def __iter__(self) -> Iterator[Live]:
        return iter(list(self._live.values()))

    def ids(self) -> list[str]:
        return list(self._live)

    async def suspend(self, live: Live) -> Suspension | None:
        """Take the session out of the engine between two steps, its model state exported,
        and keep that as ``live.suspension`` (it leaves at the rung the scheduler had it at).
        The one suspend: a dropped connection (``Service.disconnected``) and a hand-off
        (``Migration.hand_off``) both come here; a second caller waits for the first and gets
        its suspension. None if the session ended meanwhile."""
        if live.suspending is not None:
            await asyncio.shield(live.suspending)
        if live.suspension is not None:
            return live.suspension
        sid = live.sid
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        live.suspending = fut
        susp = Suspension(sid, live.next_block, None, live.level, live.settings)  # if the engine has none
        try:
            engine = self.gate.scheduled(sid)
            if engine is not None:
                susp = await engine.suspend(sid)
        except (KeyError, RuntimeError) as exc:  # ended meanwhile, or the engine stopped
            if self.get(sid) is live:
                log.warning("suspend failed: %s", exc, extra={"sid": sid})
        finally:
            live.suspending = None
            fut.set_result(None)
        if self.get(sid) is not live:
            return None
        live.suspension = susp = live.with_restored(susp)  # never reopened: the old state holds
        live.at_rung(susp.level, susp.settings)
        return susp

    def close(self, sid: str, reason: str) -> bool:
        """End a session for good; its peer (if any) is told ``ended``. False if unknown."""
        live = self._live.get(sid)
        if live is not None and live.end_reason is None:
            live.end_reason = reason
        return self.store.close(sid)

    def counts(self) -> tuple[dict[str, int], dict[int, int]]:
        """Sessions by state, and attached ones by ladder level (for the metrics)."""
        by_state = {"active": self.store.active_count, "detached": self.store.detached_count}
        by_level = Counter(live.level for live in self._live.values() if live.peer is not None)
        return by_state, dict(by_level)

    def _disposed(self, session: Any) -> None:
        """Store hook: a session object left the store (closed, evicted, expired, new epoch)."""
        sid = session.id
        if sid in self.store:
            return  # a new epoch replaced it; whoever opened the epoch handles the engine
        live = self._live.pop(sid, None)
        if live is None:
            return
        reason = live.end_reason
        if reason is None:
            reason = "evicted" if self.store.evicted != self._evicted_seen else "expired"
        self._evicted_seen = self.store.evicted
        peer = live.peer
        live.unbind()
        engine = self.gate.scheduled(sid)
        if engine is not None:
            engine.remove_session(sid)
        if peer is not None:
            code = CloseCode.GOING_AWAY if reason in ("shutdown", "migrated") else CloseCode.NORMAL
            peer.end(Ended(sid, reason), code)
        if self.gate.remote is not None:
            self.gate.remote.ended(sid, reason)
        self.metrics.sessions_ended.labels(reason).inc()
        log.info("session ended", extra={"sid": sid, "reason": reason})
