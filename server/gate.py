"""Whether this worker takes sessions: its phase, the engine once it runs, the directory.

``Gate`` is the one place the service's parts ask "may I use the engine now?": the phase
(warming, ready, draining, failed), the engine (set by ``Service.start_engine``), the
shared directory (``Remote``, set by server/cluster/agent.py in multi-worker mode) and the
drain flag (no new sessions or resumes while handing sessions over).
"""

from __future__ import annotations

from worldserve.server.engine import Engine
from worldserve.server.live import NotReady, Phase
from worldserve.server.remote import Remote


class Gate:
    """The worker's phase, engine and directory; see the module docstring."""

    def __init__(self) -> None:
        self.phase = Phase.WARMING
        self.failure: str | None = None
        self.engine: Engine | None = None
        self.remote: Remote | None = None  # the shared directory (server/cluster/agent.py), if any
        self.draining = False  # handing sessions over: no new sessions or resumes here

    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY and self.engine is not None and self.engine.running

    def fail(self, reason: str) -> None:
        self.phase = Phase.FAILED
        self.failure = reason

    def require_ready(self) -> Engine:
        """The running engine; ``NotReady`` (with a retry-after) when there is none."""
        if not self.ready or self.engine is None:
            phase = Phase.FAILED if self.phase is Phase.READY else self.phase
            raise NotReady(phase, 1.0 if phase is Phase.WARMING else 5.0)
        return self.engine

    def require_admitting(self, retry_after: float) -> Engine:
        """``require_ready``, and not draining (new sessions and resumes go elsewhere)."""
        engine = self.require_ready()
        if self.draining:
            raise NotReady(Phase.DRAINING, retry_after)
        return engine

    def scheduled(self, sid: str) -> Engine | None:
        """The engine if ``sid`` is in its schedule now, else None."""
        engine = self.engine
        return engine if engine is not None and sid in engine.scheduler else None

    def utilisation(self) -> float:
        return self.engine.scheduler.utilisation() if self.engine is not None else 0.0
