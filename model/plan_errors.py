"""How a runner keeps one session's failure to that session (both model families use it)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TypeVar

from worldserve.session.plan import StepOutput

log = logging.getLogger(__name__)

S = TypeVar("S")


def guarded(out: StepOutput, sid: str, fn: Callable[..., None], arg: object) -> None:
    """Run ``fn(arg)`` for session ``sid``; an exception becomes that session's error in
    ``out.errors`` and the rest of the plan still runs."""
    try:
        fn(arg)
    except Exception as exc:  # one session's bad input never fails the plan
        log.warning("session %s: %s", sid, exc)
        out.errors[sid] = str(exc)


def session_state(sessions: Mapping[str, S], session_id: str) -> S:
    """A session's physical state, or a KeyError naming the session."""
    try:
        return sessions[session_id]
    except KeyError:
        raise KeyError(f"runner has no state for session {session_id!r}") from None
