"""The worldserve command line."""

from __future__ import annotations

import argparse

import pytest

from server import cli


def parse(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    cli.serve_parser(ap)
    return ap.parse_args(argv)


def test_serve_options_become_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLDSERVE_API_KEYS", "b,c")
    s = cli.settings_from(parse(
        "--port", "9001", "--capacity", "3", "--threads", "2", "--batch-sizes", "1,2",
        "--buckets", "64", "--api-key", "a", "--min-steps", "3", "--no-batching",
    ))
    assert (s.port, s.capacity, s.threads) == (9001, 3, 2)
    assert s.warmup_batch_sizes == (1, 2) and s.buckets == (64,)
    assert s.api_keys == frozenset({"a", "b", "c"}) and s.min_steps == 3 and not s.batching


def test_defaults_serve_on_loopback_port_8000(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLDSERVE_PORT", raising=False)
    monkeypatch.delenv("WORLDSERVE_HOST", raising=False)
    s = cli.settings_from(parse())
    assert (s.host, s.port, s.threads) == ("127.0.0.1", 8000, 1)


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        cli.settings_from(parse("--capacity", "0"))


def test_train_delegates_to_model_train(monkeypatch: pytest.MonkeyPatch) -> None:
    import model.train

    seen: list[list[str]] = []
    monkeypatch.setattr(model.train, "main", lambda argv=None: seen.append(argv))
    cli.main(["train", "--minutes", "1", "--out", "x"])
    assert seen == [["--minutes", "1", "--out", "x"]]
