"""The Wan family's tests share two tiny ``--weights`` directories, each built once a run
(tests/model/wan/tiny_dir.py, tiny_mg_dir.py); a test that changes one works on a copy.
``tiny_dir.load_tiny`` loads a runner from one as the server does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.model.wan.tiny_dir import build_tiny_wan_dir
from tests.model.wan.tiny_mg_dir import build_tiny_mg_dir


@pytest.fixture(scope="session")
def wan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wan-causal directory: the authors' .pt and config.json, the VAE, UMT5 and its tokenizer."""
    return build_tiny_wan_dir(tmp_path_factory.mktemp("wan"))


@pytest.fixture(scope="session")
def mg_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A matrix-game-2 directory (the universal variant): its checkpoint, VAE and CLIP image encoder."""
    return build_tiny_mg_dir(tmp_path_factory.mktemp("mg"))
