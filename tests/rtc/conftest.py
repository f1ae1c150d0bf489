from __future__ import annotations

from tests.server.conftest import blockbuster, model_weights

__all__ = ["blockbuster", "model_weights"]
