"""The store of what outlives a process (``server/store/``), on a directory and on a local S3
server: objects come back whole or are refused by name, never misread."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worldserve.server.store import (
    CorruptObject,
    FsspecStore,
    LocalStore,
    NoSuchObject,
    ObjectTooLarge,
    Store,
    StoreError,
    open_store,
)
from worldserve.server.store.objects import HEADER, frame


def _raw_put(store: Store, name: str, data: bytes) -> None:
    """Bytes under ``name`` as a faulty disk, a crashed copy or a hand would leave them."""
    if isinstance(store, LocalStore):
        path = store.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    else:
        assert isinstance(store, FsspecStore)
        store.fs.pipe_file(f"{store.root}/{name}", data)


def test_an_object_comes_back_as_written_and_is_listed_and_deleted(store: Store) -> None:
    store.put("worlds/a1", b"first", kind=7)
    store.put("worlds/b2", b"")
    store.put("checkpoints/s-1", b"x" * 1000)
    assert store.get("worlds/a1") == (7, b"first") and store.get("worlds/b2") == (0, b"")
    store.put("worlds/a1", b"second", kind=8)  # replaced whole
    assert store.get("worlds/a1") == (8, b"second")
    assert store.list("worlds") == ["worlds/a1", "worlds/b2"]
    assert store.list() == ["checkpoints/s-1", "worlds/a1", "worlds/b2"]
    assert store.delete("worlds/a1") and not store.delete("worlds/a1")
    with pytest.raises(NoSuchObject, match="no object 'worlds/a1'"):
        store.get("worlds/a1")
    assert store.list("nothing-here") == []


@pytest.mark.parametrize("damage", ["truncated", "flipped", "padded", "foreign", "header only"])
def test_a_damaged_object_is_refused_by_name(store: Store, damage: str) -> None:
    good = frame(b"a saved world" * 100, 1, store.max_bytes)
    bad = {
        "truncated": good[:-5],
        "flipped": good[:-1] + bytes([good[-1] ^ 1]),
        "padded": good + b"\0",
        "foreign": b"PK\x03\x04 a zip file, not a world" * 4,
        "header only": good[: HEADER.size - 3],
    }[damage]
    _raw_put(store, "worlds/w", bad)
    with pytest.raises(CorruptObject, match="worlds/w"):
        store.get("worlds/w")


@pytest.mark.parametrize("name", ["", "../escape", "/etc/passwd", ".hidden", "a//b", "a/../b", "a b", "x" * 129,
                                  "a/b/c/d/e", "ok/\u00e9"])
def test_a_bad_name_is_refused_before_any_io(store: Store, name: str) -> None:
    with pytest.raises(StoreError, match="invalid object name"):
        store.put(name, b"x")
    with pytest.raises(StoreError, match="invalid object name"):
        store.get(name)


def test_sizes_are_capped_on_write_and_on_read(store: Store) -> None:
    with pytest.raises(ObjectTooLarge, match="over the store's cap"):
        store.put("big", b"\0" * (store.max_bytes + 1))
    assert store.list() == []
    huge = frame(b"x", 0, 2**30)[: HEADER.size]  # a header that claims more than the cap
    huge = huge[:16] + (2**29).to_bytes(8, "big") + huge[24:]
    _raw_put(store, "planted", huge + b"x" * 64)
    with pytest.raises(ObjectTooLarge, match="planted"):
        store.get("planted")


def test_a_crashed_write_leaves_the_old_object_and_its_temporary_is_never_served(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    store.put("worlds/w", b"old")
    (store.root / "worlds" / ".w.0123.tmp").write_bytes(frame(b"half", 0, store.max_bytes)[:20])
    assert store.get("worlds/w") == (0, b"old")
    assert store.list() == ["worlds/w"]


def test_a_directory_others_may_write_to_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(StoreError, match="written by others"):
        LocalStore(shared)
    made = LocalStore(tmp_path / "new" / "store")
    assert (made.root.stat().st_mode & 0o777) == 0o700


def test_a_url_picks_the_store() -> None:
    assert isinstance(open_store("/tmp/ws-store-test"), LocalStore)
    assert isinstance(open_store("file:///tmp/ws-store-test"), LocalStore)
    assert isinstance(open_store("memory://bucket/x"), FsspecStore)


def test_the_store_setting_resolves_auto_to_a_private_data_directory_and_none_to_off(tmp_path: Path) -> None:
    from worldserve.server.store import resolve_store

    assert resolve_store(None) is None and resolve_store("none") is None and resolve_store("") is None
    assert resolve_store("s3://bucket/prefix") == "s3://bucket/prefix"
    got = resolve_store("auto", {"XDG_DATA_HOME": str(tmp_path / "data")})
    assert got == str(tmp_path / "data" / "worldserve" / "store")
    assert (Path(got).stat().st_mode & 0o777) == 0o700
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # nothing can be made under it
    assert resolve_store("auto", {"XDG_DATA_HOME": str(blocked)}) is None
