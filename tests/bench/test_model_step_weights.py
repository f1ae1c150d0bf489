"""worldserve.bench.model_step times the weights it is given: a path with or without the suffix, and
named weights that are missing are an error, never a silently random model."""

from __future__ import annotations

from pathlib import Path

import pytest

from worldserve.bench.model_step import main, weights_or_init
from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.weights import DEFAULT_WEIGHTS


def test_weights_load_with_or_without_the_suffix() -> None:
    bare = DEFAULT_WEIGHTS.with_suffix("")
    for given in (DEFAULT_WEIGHTS, bare):
        model, source = weights_or_init(given)
        assert model.cfg == ModelConfig.from_json(DEFAULT_WEIGHTS.with_suffix(".json").read_text())
        assert source == str(DEFAULT_WEIGHTS)


def test_named_weights_that_are_missing_are_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(FileNotFoundError, match="no weights at"):
        weights_or_init(tmp_path / "nothing")
    with pytest.raises(SystemExit):
        main(["--weights", str(tmp_path / "nothing"), "--batches", "1"])
    assert "no weights at" in capsys.readouterr().err
