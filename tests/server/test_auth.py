"""The shared API-key check (``server/auth.py``)."""

from __future__ import annotations

from worldserve.server.auth import authorized, bearer_key, key_ok, presented_key

KEYS = frozenset({"alpha-key-1", "beta-key-22"})


def test_no_key_configured_lets_anything_through() -> None:
    assert key_ok(None, frozenset())
    assert key_ok("", frozenset())
    assert key_ok("whatever", ())
    assert authorized({}, frozenset())


def test_right_key_matches_any_configured_key() -> None:
    assert key_ok("alpha-key-1", KEYS)
    assert key_ok("beta-key-22", KEYS)


def test_wrong_key_is_refused() -> None:
    assert not key_ok("alpha-key-2", KEYS)
    assert not key_ok("alpha-key-1 ", KEYS)
    assert not key_ok("ALPHA-KEY-1", KEYS)
    assert not key_ok("é-not-ascii", KEYS)  # non-ASCII compares as bytes, no TypeError


def test_missing_or_empty_key_is_refused() -> None:
    assert not key_ok(None, KEYS)
    assert not key_ok("", KEYS)
    assert not key_ok("", frozenset({""}))  # even if an empty key were configured


def test_bearer_parsing() -> None:
    assert bearer_key({"Authorization": "Bearer alpha-key-1"}) == "alpha-key-1"
    assert bearer_key({"Authorization": "Bearer "}) == ""
    assert bearer_key({"Authorization": "bearer alpha-key-1"}) is None  # scheme as clients send it
    assert bearer_key({"Authorization": "Basic YWxhZGRpbjpvcGVu"}) is None
    assert bearer_key({"Authorization": "alpha-key-1"}) is None
    assert bearer_key({}) is None


def test_field_wins_over_header() -> None:
    right = {"Authorization": "Bearer alpha-key-1"}
    assert presented_key(right) == "alpha-key-1"
    assert presented_key(right, "beta-key-22") == "beta-key-22"
    assert authorized(right, KEYS)
    assert authorized({}, KEYS, "beta-key-22")
    assert not authorized(right, KEYS, "wrong")  # a wrong field is not rescued by the header
    assert authorized({"Authorization": "Bearer wrong"}, KEYS, "alpha-key-1")
    assert not authorized({"Authorization": "Bearer "}, KEYS)
    assert not authorized({}, KEYS)
