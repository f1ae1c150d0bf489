"""Rate limits: a token bucket with an injected clock."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up; ``take`` spends one."""

    __slots__ = ("_clock", "_last", "_tokens", "burst", "rate")

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not rate > 0 or burst < 1:
            raise ValueError(f"need rate > 0 and burst >= 1, got {rate!r}, {burst!r}")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def take(self) -> bool:
        """Spend a token if there is one."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    @classmethod
    def per_chunk(cls, fps: float, chunk_frames: int, burst: int, clock: Callable[[], float]) -> TokenBucket:
        """One token per chunk period of a session at ``fps`` (``chunk_frames`` a chunk): the
        budget of its costly inputs (prompts, observations, new epochs), each of which costs
        about a chunk's model time."""
        return cls(fps / chunk_frames, burst, clock)

    def level(self) -> float:
        """The tokens there now."""
        self._refill()
        return self._tokens

    def filled_to(self, tokens: float) -> TokenBucket:
        """Set to ``tokens`` (at most ``burst``): a session arriving from another worker
        goes on with what it had left there; returns the bucket."""
        self._tokens, self._last = min(float(self.burst), max(0.0, tokens)), self._clock()
        return self

    def wait_time(self) -> float:
        """Seconds until a token is there (0 if one is there now)."""
        self._refill()
        return max(0.0, (1.0 - self._tokens) / self.rate)
