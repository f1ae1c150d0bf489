from __future__ import annotations

import pytest

from tests.browser.browser import missing
from tests.server.conftest import model_weights

__all__ = ["model_weights"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    why = missing()
    if why is None:
        return
    for item in items:
        if "tests/browser" in str(item.fspath):
            item.add_marker(pytest.mark.skip(reason=why))
