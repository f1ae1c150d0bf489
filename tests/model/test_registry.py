"""The model registry: names, the default unchanged, unknown names and missing weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from worldserve.cli.serve import serve_parser, settings_from
from worldserve.model.registry import DEFAULT, LoadOptions, check, load, names
from worldserve.server.settings import Settings


def test_the_registry_serves_the_default_the_wan_causal_family_and_matrix_game() -> None:
    assert names() == ("default", "wan-causal", "matrix-game-2")
    assert DEFAULT == Settings().model == "default"


def test_serve_defaults_to_the_default_model_and_takes_wan_causal_with_a_directory() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    serve_parser(ap)
    assert settings_from(ap.parse_args([])).model == "default"
    s = settings_from(ap.parse_args(["--model", "wan-causal", "--weights", "w", "--sizes", "480x832,240x416"]))
    assert (s.model, s.weights, s.sizes) == ("wan-causal", Path("w"), ((480, 832), (240, 416)))
    with pytest.raises(SystemExit):
        ap.parse_args(["--sizes", "480by832"])


def test_an_unknown_model_is_an_error_listing_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'wan'; known models: default, wan-causal"):
        check("wan", None)
    with pytest.raises(ValueError, match="unknown model"):
        load("nope", LoadOptions())


def test_the_default_model_loads_as_before() -> None:
    from worldserve.model.default.runner import ModelRunner

    check("default", None)  # the shipped weights
    runner = load("default", LoadOptions(dtype="float32", max_sessions=2))
    assert isinstance(runner, ModelRunner) and runner.buckets == runner.cfg.buckets


def test_missing_weights_are_errors_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope.safetensors")):
        check("default", tmp_path / "nope.safetensors")
    with pytest.raises(ValueError, match="needs --weights DIR"):
        check("wan-causal", None)
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        check("wan-causal", tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "transformer" / "config.json")):
        check("wan-causal", tmp_path)


def test_serve_stops_at_startup_naming_the_missing_file(tmp_path: Path) -> None:
    from worldserve.cli.main import main

    with pytest.raises(SystemExit, match=f"worldserve serve: .*{tmp_path / 'transformer' / 'config.json'}"):
        main(["serve", "--model", "wan-causal", "--weights", str(tmp_path), "--port", "0"])
