from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained default weights when they are there; else a random-init model saved to
    a temp dir. Its zero-initialised layers (adaLN, heads) get small random values: as
    initialised, the model ignores actions and prompts, and the tests check that those
    change the frames."""
    from model.weights import DEFAULT_WEIGHTS, config_path

    if DEFAULT_WEIGHTS.exists() and config_path(DEFAULT_WEIGHTS).exists():
        return DEFAULT_WEIGHTS
    import torch

    from model.config import ModelConfig
    from model.dit import WorldModel
    from model.weights import save_model

    torch.manual_seed(0)
    model = WorldModel(ModelConfig())
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(0.0, 0.05)
    return save_model(model, tmp_path_factory.mktemp("weights") / "random.safetensors")
