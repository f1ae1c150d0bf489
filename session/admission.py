"""Admission control: admit a new session at full quality, admit it degraded, or refuse.

The decision walks the new session's own ladder from the top and takes the first rung at
which the predicted utilisation, with the session added to the current load, stays within
``threshold``. Running sessions are left exactly as they are: admission never evicts or
degrades anyone to make room. If even the bottom rung does not fit, the answer is a refusal
with a retry-after hint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from worldserve.session.costmodel import Load
from worldserve.session.degrade import DemandOf, Rung


class Verdict(StrEnum):
    FULL = "full"
    DEGRADED = "degraded"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class AdmissionOptions:
    threshold: float = 0.85  # admit while predicted utilisation stays at or below this
    retry_after: float = 5.0  # seconds a refused client should wait before retrying

    def __post_init__(self) -> None:
        if not self.threshold > 0:
            raise ValueError(f"admission threshold must be > 0, got {self.threshold!r}")


@dataclass(frozen=True, slots=True)
class Admission:
    verdict: Verdict
    level: int  # ladder rung admitted at (0 = full quality); -1 when refused
    settings: Rung | None  # what the session will run at; None when refused
    utilisation: float  # predicted utilisation with the session (at the last rung tried)
    retry_after: float | None = None  # set when refused

    @property
    def admitted(self) -> bool:
        return self.verdict is not Verdict.REFUSED


def decide(
    rungs: Sequence[Rung], load: Load, demand_of: DemandOf, options: AdmissionOptions
) -> Admission:
    """Admit at the highest rung that fits the load, or refuse. ``load`` is not changed."""
    u = float("inf")
    for level, s in enumerate(rungs):
        u = load.with_change(None, demand_of(s))
        if u <= options.threshold:
            verdict = Verdict.FULL if level == 0 else Verdict.DEGRADED
            return Admission(verdict, level, s, u)
    return Admission(Verdict.REFUSED, -1, None, u, options.retry_after)
