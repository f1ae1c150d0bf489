"""The trace cache's TorchScript is loaded only from a directory this user alone can write."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from tests.server.harness import TEST_SETTINGS
from worldserve.server.app import trace_cache_dir
from worldserve.server.trace_dir import checked, unsafe


def test_a_private_directory_is_used_as_it_is(tmp_path: Path) -> None:
    d = tmp_path / "traces"
    assert checked(d) == d and d.is_dir() and (d.stat().st_mode & 0o777) == 0o700
    (d / "entry.pt").write_bytes(b"x")
    assert checked(d) == d


@pytest.mark.parametrize("what", ["directory", "entry"])
def test_a_directory_others_can_write_is_passed_over_for_a_private_one(tmp_path: Path, what: str) -> None:
    d = tmp_path / "shared"
    d.mkdir()
    entry = d / "planted.pt"
    entry.write_bytes(b"TorchScript is code")
    os.chmod(d if what == "directory" else entry, 0o777)
    assert unsafe(d) is not None
    got = checked(d)
    assert got != d and unsafe(got) is None and (got.stat().st_mode & 0o077) == 0


def test_a_directory_of_another_owner_is_passed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 1)  # as if another user made it
    assert "owned by uid" in (unsafe(d) or "")


def test_a_symlinked_directory_is_passed_over(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    assert "symbolic link" in (unsafe(link) or "")
    assert checked(link) != link


def test_the_worker_hands_the_model_a_checked_directory(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    got = trace_cache_dir(replace(TEST_SETTINGS, model="default", trace_cache=True, trace_cache_dir=d))
    assert got is not None and got != d and unsafe(got) is None
    assert trace_cache_dir(replace(TEST_SETTINGS, trace_cache=False, trace_cache_dir=d)) == d
