"""Reading a version 5 snapshot (session/snapshot.py writes 6): a worker reads versions N and
N - 1, so that a rolling upgrade that bumps the version loses no migration.

Version 5 is version 6 but for the model map: the default family's state travelled in a
``continuation`` map and Matrix-Game's in an ``actions`` map, where version 6 has the family's
named arrays (``family_state``). ``upgrade`` rewrites those maps as the entries the families
read today (model/default/slot.py, reference/anchor.py, reference/canvas/state.py,
model/wan/matrix_game.py); everything is then validated as version 6 is.
"""

from __future__ import annotations

from typing import Any

from worldserve.session.errors import SnapshotError
from worldserve.session.family_state import pack_scalar
from worldserve.session.msgfields import MAX_INT, pack_array

VERSION = 5
# version 5 map key -> version 6 family_state entry (arrays as they were packed)
_CONTINUATION = {"kv": "kv", "prev": "prev", "anchor": "anchor", "anchor_offset": "anchor_offset"}
_CONTINUATION_INTS = {"anchor_wait": "anchor_wait", "anchor_age": "anchor_age"}
_CANVAS = {"keys": "canvas_keys", "codes": "canvas_codes", "position": "canvas_position"}
_SEEN = {"keys": "canvas_seen_keys", "pixels": "canvas_seen"}
_ACTIONS = {"keyboard": "action_keyboard", "mouse": "action_mouse"}
_ACTIONS_INTS = {"first": "action_first", "anchor_frame": "action_anchor_frame"}


def _map(value: object, path: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise SnapshotError(f"{path}: expected a map")
    return value


def _copy(src: dict[Any, Any], names: dict[str, str], ints: dict[str, str], out: dict[str, object], path: str) -> None:
    for old, new in names.items():
        if src.get(old) is not None:
            out[new] = src[old]  # the packed array as it was: version 6 checks it
    for old, new in ints.items():
        v = src.get(old)
        if v is None:
            continue
        if type(v) is not int or not 0 <= v <= MAX_INT:
            raise SnapshotError(f"{path}.{old}: expected an integer in [0, {MAX_INT}]")
        out[new] = pack_array(pack_scalar(v))


def upgrade(obj: dict[Any, Any]) -> dict[Any, Any]:
    """A version 5 snapshot map as version 6's."""
    model = dict(_map(obj.get("model"), "snapshot.model"))
    state: dict[str, object] = {}
    cont = model.pop("continuation", None)
    if cont is not None:
        cont = _map(cont, "snapshot.model.continuation")
        _copy(cont, _CONTINUATION, _CONTINUATION_INTS, state, "snapshot.model.continuation")
        if cont.get("canvas") is not None:
            canvas = _map(cont["canvas"], "snapshot.model.continuation.canvas")
            _copy(canvas, _CANVAS, {"seed": "canvas_seed"}, state, "snapshot.model.continuation.canvas")
            if canvas.get("seen") is not None:
                _copy(_map(canvas["seen"], "snapshot.model.continuation.canvas.seen"), _SEEN, {}, state, "")
    actions = model.pop("actions", None)
    if actions is not None:
        _copy(_map(actions, "snapshot.model.actions"), _ACTIONS, _ACTIONS_INTS, state, "snapshot.model.actions")
    model["family_state"] = state
    return {**obj, "version": VERSION + 1, "model": model}



