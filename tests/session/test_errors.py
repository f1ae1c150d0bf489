"""Typed errors: stable codes and messages that name the values involved."""

from __future__ import annotations

import pytest

from worldserve.session.errors import (
    AtCapacity,
    BadToken,
    IllegalTransition,
    SessionError,
    SessionStateMissing,
    SnapshotError,
    StaleBlock,
)


@pytest.mark.parametrize(
    ("error", "code", "needles"),
    [
        (
            SessionStateMissing("abc", 7),
            "missing_session_state",
            ["missing session state", "abc", "7"],
        ),
        (StaleBlock("abc", 9, 4), "stale_block", ["abc", "9", "4"]),
        (AtCapacity(16, 2.5), "at_capacity", ["16", "2.5"]),
        (
            IllegalTransition("abc", "closed", "attach"),
            "illegal_transition",
            ["abc", "closed", "attach"],
        ),
        (BadToken("abc"), "bad_token", ["abc"]),
        (SnapshotError("truncated"), "bad_snapshot", ["truncated"]),
    ],
)
def test_every_error_has_a_stable_code_and_names_its_values(
    error: SessionError, code: str, needles: list[str]
) -> None:
    assert isinstance(error, SessionError)
    assert error.code == code
    for needle in needles:
        assert needle in str(error)
