from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.model.conftest import randomized, tiny_config
from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.weights import WeightsError, load_model, save_model


def test_weights_round_trip(tmp_path: Path) -> None:
    model = randomized(tiny_config())
    path = save_model(model, tmp_path / "m")
    loaded = load_model(path)
    assert loaded.cfg == model.cfg
    for k, v in model.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k


def test_missing_key_is_named(tmp_path: Path) -> None:
    path = save_model(randomized(tiny_config()), tmp_path / "m")
    state = load_file(str(path))
    del state["blocks.1.mlp.fc1.weight"]
    save_file(state, str(path))
    with pytest.raises(WeightsError, match=r"blocks\.1\.mlp\.fc1\.weight"):
        load_model(path)


def test_wrong_shape_is_named(tmp_path: Path) -> None:
    path = save_model(randomized(tiny_config()), tmp_path / "m")
    state = load_file(str(path))
    state["final_ada.weight"] = torch.zeros(3, 3)
    save_file(state, str(path))
    with pytest.raises(WeightsError, match=r"final_ada\.weight.*\(3, 3\)"):
        load_model(path)


def test_config_validation_quotes_the_bad_value() -> None:
    with pytest.raises(ValueError, match="100"):
        ModelConfig(buckets=(100,))
    with pytest.raises(ValueError, match="heads 5"):
        ModelConfig(width=192, heads=5)
