"""Quotas per client: how fast a client may open sessions (a worker's ``start``, a router's
``place``) and how many sessions it may hold at once on a worker.

A client is its address (the TCP peer: behind a proxy, the proxy's, so put each worker or
router where it sees its clients, or give every client its own API key) and, when it
presents one, its API key: each is charged, and either over its limit refuses. Limits are
token buckets (server/limits.py) kept for the ``MAX_CLIENTS`` clients seen last, so the
table stays bounded whatever the number of addresses. A refusal is ``OverQuota`` with the
seconds after which the client may try again: 429 with ``Retry-After`` over HTTP, an
``over_quota`` error (with ``retry_after``) that closes a WebSocket 1013.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable

from worldserve.protocol import ErrorCode
from worldserve.server.limits import TokenBucket

MAX_CLIENTS = 4096


class OverQuota(Exception):
    code = ErrorCode.OVER_QUOTA

    def __init__(self, message: str, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)


def clients(address: str | None, key: str | None) -> tuple[str, ...]:
    """Who a request is charged to: its address and, if it presented one, its API key (as a
    digest: the table never holds a key)."""
    who = [f"address {address or 'unknown'}"]
    if key:
        who.append("key " + hashlib.sha256(key.encode()).hexdigest()[:16])
    return tuple(who)


class Quotas:
    """Per-client rate of new sessions and, given ``sessions``, sessions held at once."""

    def __init__(
        self, rate: float, burst: int, sessions: int = 0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if sessions < 0:
            raise ValueError(f"sessions must be >= 0 (0: no limit), got {sessions}")
        self.rate, self.burst, self.sessions = rate, burst, sessions
        self._clock = clock
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._held: OrderedDict[str, set[str]] = OrderedDict()

    def take(self, who: tuple[str, ...], held: Callable[[str], bool] = lambda sid: False) -> None:
        """Charge one new session to each of ``who``; OverQuota (nothing charged) if any is
        over its rate or, with ``held`` saying which of its sessions are still held, over
        its count."""
        for bucket in self.check(who, held):
            bucket.take()

    def check(self, who: tuple[str, ...], held: Callable[[str], bool] = lambda sid: False) -> list[TokenBucket]:
        """``take`` without charging (a transport refuses before costly set-up); the buckets
        a ``take`` would charge."""
        for w in who:
            sids = self._held.get(w)
            if sids is not None:
                sids.intersection_update({sid for sid in sids if held(sid)})
                if self.sessions and len(sids) >= self.sessions:
                    raise OverQuota(f"{w} holds {len(sids)} sessions, the most it may", 1.0 / self.rate)
        buckets = [self._bucket(w) for w in who]
        for w, bucket in zip(who, buckets, strict=True):
            wait = bucket.wait_time()
            if wait > 0:
                raise OverQuota(f"{w} opens sessions faster than {self.rate:g}/s", wait)
        return buckets

    def opened(self, who: tuple[str, ...], sid: str) -> None:
        """Count ``sid`` against each of ``who`` while it is held."""
        if not self.sessions:
            return
        for w in who:
            self._held.setdefault(w, set()).add(sid)
            self._held.move_to_end(w)
            while len(self._held) > MAX_CLIENTS:
                self._held.popitem(last=False)

    def _bucket(self, w: str) -> TokenBucket:
        bucket = self._buckets.get(w)
        if bucket is None:
            bucket = self._buckets[w] = TokenBucket(self.rate, self.burst, self._clock)
            while len(self._buckets) > MAX_CLIENTS:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(w)
        return bucket
