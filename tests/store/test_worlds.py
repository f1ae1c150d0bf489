"""Saved worlds on a store (``server/worlds.py``): saved whole, listed, read for a fork, deleted
by their owner or the admin only, and refused by name where their version or bytes are not ours."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgpack
import pytest

from worldserve.server.store import LocalStore, Store
from worldserve.server.worlds import WORLD_VERSION, UnknownWorld, WorldError, WorldShelf

OWNER = hashlib.sha256(b"owner-token").hexdigest()
OTHER = hashlib.sha256(b"someone-else").hexdigest()


def test_a_world_is_saved_listed_forked_and_deleted_by_its_owner(store: Store) -> None:
    shelf = WorldShelf(store)
    a = shelf.save("harbour at dusk", OWNER, "default", 120, b"snapshot-a" * 50)
    b = shelf.save("forest", OTHER, "default", 30, b"snapshot-b")
    assert [m.id for m in shelf.list()] == [a.id, b.id]
    assert [m.id for m in shelf.list(OWNER)] == [a.id]
    assert "owner_sha256" not in a.public() and a.public()["name"] == "harbour at dusk"
    meta, state = shelf.state(a.id)
    assert meta == a and state == b"snapshot-a" * 50
    with pytest.raises(UnknownWorld):  # not the owner: told what an unknown id is told
        shelf.delete(a.id, OTHER)
    shelf.delete(a.id, OWNER)
    shelf.delete(b.id, None, admin=True)
    assert shelf.list() == []
    with pytest.raises(UnknownWorld, match="no world"):
        shelf.state(a.id)


@pytest.mark.parametrize("name", ["", "   ", "x" * 81, "tab\there"])
def test_a_bad_name_is_refused(store: Store, name: str) -> None:
    with pytest.raises(WorldError, match="name"):
        WorldShelf(store).save(name, OWNER, "default", 1, b"s")


@pytest.mark.parametrize("world_id", ["../../etc", "short", "a/b/c/d/e/f/g/h", "x" * 65])
def test_an_id_that_cannot_be_a_world_is_unknown(store: Store, world_id: str) -> None:
    with pytest.raises(UnknownWorld):
        WorldShelf(store).state(world_id)


def test_a_world_of_another_version_or_a_forged_meta_is_refused_by_name(store: Store) -> None:
    shelf = WorldShelf(store)
    w = shelf.save("old", OWNER, "default", 5, b"state")
    store.put(f"worlds/{w.id}/meta", store.get(f"worlds/{w.id}/meta")[1], kind=WORLD_VERSION + 1)
    with pytest.raises(WorldError, match=f"version {WORLD_VERSION + 1}; this server reads version {WORLD_VERSION}"):
        shelf.state(w.id)
    assert shelf.list() == []  # unreadable: not listed, and not misread
    forged = msgpack.packb({"format": "worldserve/saved-world", "version": 1, "id": w.id}, use_bin_type=True)
    store.put(f"worlds/{w.id}/meta", forged, kind=WORLD_VERSION)
    with pytest.raises(WorldError, match="not a saved world's"):
        shelf.meta(w.id)


def test_a_state_that_is_not_the_one_saved_is_refused(store: Store) -> None:
    shelf = WorldShelf(store)
    w = shelf.save("swapped", OWNER, "default", 5, b"state")
    store.put(f"worlds/{w.id}/state", b"another state", kind=WORLD_VERSION)
    with pytest.raises(WorldError, match="not the one its meta describes"):
        shelf.state(w.id)


def test_a_world_is_listed_only_once_whole(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    shelf = WorldShelf(store)
    store.put("worlds/AAAAAAAAAAAAAAAA/state", b"a state whose meta was never written")
    assert shelf.list() == []
    assert WorldShelf(store, max_worlds=1).save("one", OWNER, "default", 1, b"s")
    with pytest.raises(WorldError, match="limit of 1 worlds"):
        WorldShelf(store, max_worlds=1).save("two", OWNER, "default", 1, b"s")


def test_a_world_whose_random_id_starts_with_a_dash_is_still_a_valid_object_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import worldserve.server.worlds as worlds

    monkeypatch.setattr(worlds.secrets, "token_urlsafe", lambda n: "-_starts-oddly")
    shelf = WorldShelf(LocalStore(tmp_path))
    meta = shelf.save("odd id", OWNER, "default", 1, b"state")
    assert meta.id[0].isalnum() and shelf.state(meta.id)[1] == b"state"
