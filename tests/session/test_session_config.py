"""SessionConfig validation: every bad value is rejected and quoted."""

from __future__ import annotations

import math

import pytest

from worldserve.session.session import SessionConfig


def test_default_config_is_valid() -> None:
    config = SessionConfig()
    assert config.mode == "push"
    assert isinstance(config.fps, float)


def test_int_fps_is_normalised_to_float() -> None:
    assert SessionConfig(fps=30).fps == 30.0
    assert isinstance(SessionConfig(fps=30).fps, float)


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("fps", 0),
        ("fps", -1.0),
        ("fps", math.nan),
        ("fps", math.inf),
        ("fps", "24"),
        ("fps", True),
        ("bucket", 0),
        ("bucket", 64.0),
        ("bucket", True),
        ("steps", 0),
        ("lookahead", -1),
        ("mode", "poll"),
        ("priority", 10**6),
        ("seed", -1),
        ("seed", 2**64),
    ],
)
def test_bad_config_value_is_rejected_and_quoted(field: str, bad: object) -> None:
    with pytest.raises(ValueError, match=field) as info:
        SessionConfig(**{field: bad})  # type: ignore[arg-type]
    assert repr(bad) in str(info.value)
