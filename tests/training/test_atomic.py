"""Checkpoints' JSON is written whole: a write that fails mid-way leaves the old file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from worldserve.training import atomic
from worldserve.training.tokenizer import save_checkpoint


def _failing_halfway(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Path.write_text

    def half_then_full_disk(self: Path, text: str, *a: object, **kw: object) -> int:
        real(self, text[: len(text) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_full_disk)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "report.json"
    atomic.write_text(f, '{"steps": 1}')
    _failing_halfway(monkeypatch)
    with pytest.raises(OSError):
        atomic.write_text(f, json.dumps({"steps": 2, "pad": "x" * 100}))
    assert json.loads(f.read_text()) == {"steps": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_a_checkpoint_s_json_survives_a_save_that_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(model.parameters())
    save_checkpoint(tmp_path, model, opt, {"step": 1})
    _failing_halfway(monkeypatch)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, model, opt, {"step": 2, "note": "x" * 100})
    assert json.loads((tmp_path / "ckpt.json").read_text()) == {"step": 1}
