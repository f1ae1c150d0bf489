from __future__ import annotations

from tests.server.conftest import model_weights

__all__ = ["model_weights"]
