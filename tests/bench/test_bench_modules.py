"""Every benchmark module imports and parses its command line: a bench that only breaks
when someone runs it by hand is found here instead."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import worldserve.bench as bench

MODULES = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_"))  # _x: helpers


def test_there_are_benchmarks() -> None:
    assert {"model_step", "quality", "serve_load", "engine_threads", "latency", "scheduler"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_bench_module_imports_and_answers_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.import_module(f"worldserve.bench.{name}")
    assert callable(module.main), f"bench.{name} has no main()"
    with pytest.raises(SystemExit) as exc:
        module.main(["--help"])
    assert exc.value.code == 0
    assert "usage" in capsys.readouterr().out
