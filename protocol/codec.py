"""Protocol v1 on the wire: decoding, field validation and error replies.

Messages are binary WebSocket frames (or WebRTC data channel messages), each one msgpack
map with a ``type`` tag and the protocol version ``v``; the other keys are the fields of
the message dataclass (``protocol/messages.py``) whose ``TYPE`` is the tag. Unknown keys
are ignored (a v1 peer may add optional fields); a missing required field, a wrong type
or a value out of range raises ``ProtocolError`` naming the field and the reason.

``from protocol import Start, decode_client`` names the whole protocol (the package
exports the messages and these functions). ``docs/protocol.md`` documents each message
with an example.
"""

from __future__ import annotations

import math
import types
from dataclasses import MISSING, fields
from types import MappingProxyType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import msgpack

from .messages import (
    CLIENT_TYPES,
    MAX_TEXT,
    PROTOCOL_VERSION,
    SERVER_TYPES,
    ClientMessage,
    Error,
    ErrorCode,
    Image,
    ImageFormat,
    Message,
    ProtocolError,
    ServerMessage,
    _require,
)

# --- decoding ---------------------------------------------------------------------------


def decode_client(data: bytes) -> ClientMessage:
    """Decode and validate one client message; ProtocolError if it cannot be used."""
    return _decode(data, CLIENT_TYPES)  # type: ignore[return-value]


def decode_server(data: bytes) -> ServerMessage:
    """Decode and validate one server message (the SDK's side)."""
    return _decode(data, SERVER_TYPES)  # type: ignore[return-value]


def _decode(data: bytes, registry: dict[str, type[Message]]) -> Message:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ProtocolError("messages are binary msgpack")
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_array_len=4096,
            max_map_len=64,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several types on truncated or bad input
        raise ProtocolError(f"not a msgpack message: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"a message is a map, got {type(obj).__name__}")
    if "v" not in obj:  # not a v1 message at all, rather than one of another version
        raise ProtocolError(f"missing (every message carries \"v\": {PROTOCOL_VERSION})", "v")
    version = obj["v"]
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version must be {PROTOCOL_VERSION}, got {version!r}",
            "v",
            ErrorCode.UNSUPPORTED_VERSION,
        )
    tag = obj.get("type")
    cls = registry.get(tag) if isinstance(tag, str) else None
    if cls is None:
        known = ", ".join(sorted(registry))
        raise ProtocolError(f"unknown message type {tag!r}; known: {known}", "type")
    return from_wire(cls, obj)


def from_wire(cls: type[Message], obj: dict[str, Any]) -> Message:
    """Build ``cls`` from a decoded map: convert every field, then run its checks."""
    kwargs: dict[str, Any] = {}
    for name, (tp, required) in _FIELDS[cls].items():
        if name not in obj:
            if required:
                raise ProtocolError("missing", name)
            continue
        kwargs[name] = _convert(name, obj[name], tp)
    try:
        return cls(**kwargs)
    except ProtocolError:
        raise
    except (TypeError, ValueError) as exc:
        raise ProtocolError(str(exc)) from None


def _fields_of(cls: type) -> dict[str, tuple[Any, bool]]:
    hints = get_type_hints(cls)
    out = {}
    for f in fields(cls):
        required = f.default is MISSING and f.default_factory is MISSING
        out[f.name] = (hints[f.name], required)
    return out


def _convert(name: str, value: object, tp: Any) -> Any:
    """Check ``value`` against the annotation ``tp`` (the subset the messages use)."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        return _convert(name, value, rest[0])
    if origin is Literal:
        choices = get_args(tp)
        _require(value in choices and isinstance(value, str), name, f"must be one of {list(choices)}, got {value!r}")
        return value
    if origin is tuple:
        (item, *_rest) = get_args(tp)
        _require(isinstance(value, list | tuple), name, f"must be an array, got {type(value).__name__}")
        assert isinstance(value, list | tuple)
        return tuple(_convert(f"{name}[{i}]", v, item) for i, v in enumerate(value))
    if tp is bool:
        _require(isinstance(value, bool), name, f"must be a bool, got {type(value).__name__}")
        return value
    if tp is int:
        _require(
            isinstance(value, int) and not isinstance(value, bool),
            name,
            f"must be an integer, got {type(value).__name__}",
        )
        return value
    if tp is float:
        _require(
            isinstance(value, int | float) and not isinstance(value, bool),
            name,
            f"must be a number, got {type(value).__name__}",
        )
        assert isinstance(value, int | float)
        out = float(value)
        _require(math.isfinite(out), name, f"must be finite, got {value!r}")
        return out
    if tp is str:
        _require(isinstance(value, str), name, f"must be a string, got {type(value).__name__}")
        return value
    if tp is bytes:
        _require(isinstance(value, bytes), name, f"must be binary, got {type(value).__name__}")
        return value
    if tp is Image:
        _require(isinstance(value, dict), name, f"must be an image map, got {type(value).__name__}")
        assert isinstance(value, dict)
        try:
            return _image_from_wire(value)
        except ProtocolError as exc:
            raise ProtocolError(exc.reason, f"{name}.{exc.field}" if exc.field else name) from None
    raise TypeError(f"no wire conversion for {tp!r}")  # a bug in this module


def _image_from_wire(obj: dict[str, Any]) -> Image:
    fmt = _convert("format", obj.get("format"), ImageFormat)
    data = _convert("data", obj.get("data"), bytes)
    if fmt != "raw":
        return Image(fmt, data)
    shape = _convert("shape", obj.get("shape"), tuple[int, ...])
    dtype = _convert("dtype", obj.get("dtype"), str)
    return Image(fmt, data, shape, dtype)


# Each message type's fields as (annotation, required), resolved once.
_FIELDS = MappingProxyType({c: _fields_of(c) for c in (*CLIENT_TYPES.values(), *SERVER_TYPES.values())})


def error_from(exc: Exception, *, fatal: bool = False, retry_after: float | None = None) -> Error:
    """The wire ``error`` for a ProtocolError or a session-layer error (anything with ``code``)."""
    if isinstance(exc, ProtocolError):
        return Error(exc.code, exc.reason, exc.field, retry_after, fatal)
    code = getattr(exc, "code", ErrorCode.INTERNAL)
    return Error(str(code), str(exc)[:MAX_TEXT], None, retry_after, fatal)
