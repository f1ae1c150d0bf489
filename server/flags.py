"""Command-line flags and environment variables, made from the settings dataclasses.

One name per setting: the field ``worker_ttl_s`` of ``Settings`` is the flag
``--worker-ttl-s`` and the environment variable ``WORLDSERVE_WORKER_TTL_S``. A nested
settings dataclass puts its field's name in front (``Settings.rtc.codecs``:
``--rtc-codecs``, ``WORLDSERVE_RTC_CODECS``). A flag wins over the variable, the variable
over the field's default. The help text is the field's (``server.settings.setting``).

Values as text: numbers as Python writes them; booleans as ``--x`` / ``--no-x`` on the
command line and 1/0, true/false, yes/no or on/off in the environment; lists
comma-separated (``64,128``; sizes ``480x832,240x416``; a list flag may also be repeated);
ICE servers as JSON (``[{"urls": ["turn:host:3478"], "username": "u", "credential": "p"}]``);
an empty value is None where a setting may be None. A value that cannot be read names
its flag or variable and the value; a value the settings refuse names the setting and
where it came from.
"""

from __future__ import annotations

import argparse
import json
import re
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, cast, get_args, get_origin, get_type_hints

from worldserve.server.settings import IceServer

PREFIX = "WORLDSERVE_"
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Option:
    """One setting as the command line and the environment spell it."""

    path: tuple[str, ...]  # field names from the top settings class: ("rtc", "codecs")
    flag: str  # "--rtc-codecs"
    env: str  # "WORLDSERVE_RTC_CODECS"
    help: str
    type: Any  # the field's annotation
    default: object

    @property
    def dest(self) -> str:
        return "_".join(self.path)

    def parse(self, text: str) -> object:
        """The value ``text`` spells; ValueError saying what was expected."""
        return parse_value(text, self.type)


def options(cls: type, prefix: tuple[str, ...] = ()) -> list[Option]:
    """Every setting of the dataclass ``cls``, nested settings dataclasses flattened."""
    hints = get_type_hints(cls)
    out: list[Option] = []
    for f in fields(cls):
        tp = hints[f.name]
        path = (*prefix, f.name)
        if isinstance(tp, type) and is_dataclass(tp) and tp is not IceServer:
            out.extend(options(tp, path))
            continue
        help_text = f.metadata.get("help")
        if not help_text:
            raise TypeError(f"setting {cls.__name__}.{f.name} has no help text")
        name = "_".join(path)
        default = f.default if f.default is not MISSING else None
        out.append(Option(path, "--" + name.replace("_", "-"), PREFIX + name.upper(), help_text, tp, default))
    return out


def add_flags(ap: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type) -> None:
    """One flag per setting of ``cls``; a flag not given leaves no attribute on the namespace."""
    for o in options(cls):
        help_text = f"{o.help} [{o.env}; default: {show(o.default)}]".replace("%", "%%")
        if o.type is bool:
            ap.add_argument(o.flag, dest=o.dest, action=argparse.BooleanOptionalAction,
                            default=argparse.SUPPRESS, help=help_text)
            continue
        ap.add_argument(o.flag, dest=o.dest, type=_argtype(o), default=argparse.SUPPRESS,
                        metavar=_metavar(o), help=help_text,
                        action=_Extend if _is_list(o.type) else "store")


def build(cls: type[S], args: argparse.Namespace, env: Mapping[str, str]) -> S:
    """``cls`` from the flags in ``args``, then the variables in ``env``, then the defaults.

    ValueError when a variable cannot be read (naming it and its value) or when the
    settings refuse a value (their message, and where the values it names came from)."""
    values: dict[tuple[str, ...], object] = {}
    sources: dict[tuple[str, ...], str] = {}
    for o in options(cls):
        if hasattr(args, o.dest):
            values[o.path] = getattr(args, o.dest)
            sources[o.path] = o.flag
        elif o.env in env:
            text = env[o.env]
            try:
                values[o.path] = o.parse(text)
            except ValueError as exc:
                raise ValueError(f"bad setting: {o.env}={text!r}: {exc}") from None
            sources[o.path] = o.env
    return cast(S, _make(cls, (), values, sources))


def show(value: object) -> str:
    """A default as the help text shows it (the way it would be written)."""
    if value is None or value == () or value == frozenset():
        return "empty"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple | frozenset):
        return ",".join("x".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in value)
    return str(value)


# --- reading values --------------------------------------------------------------------


def parse_value(text: str, tp: Any) -> object:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        if text.strip() == "" and type(None) in args:
            return None
        (rest,) = [a for a in args if a is not type(None)]
        return parse_value(text, rest)
    if tp is bool:
        word = text.strip().lower()
        if word in TRUE or word in FALSE:
            return word in TRUE
        raise ValueError(f"expected one of {', '.join(TRUE + FALSE)}")
    if tp is int:
        try:
            return int(text.strip())
        except ValueError:
            raise ValueError("expected an integer") from None
    if tp is float:
        try:
            return float(text.strip())
        except ValueError:
            raise ValueError("expected a number") from None
    if tp is str:
        return text
    if tp is Path:
        return Path(text)
    if origin is Literal:  # case does not matter: vp8 is VP8
        match = [a for a in args if str(a).lower() == text.strip().lower()]
        if not match:
            raise ValueError(f"expected one of {', '.join(map(str, args))}")
        return match[0]
    if origin in (tuple, frozenset):
        item = args[0]
        if item is IceServer:
            return _ice_servers(text)
        if item == tuple[int, int]:
            return tuple(_size(p) for p in _items(text))
        parsed = tuple(parse_value(p, item) for p in _items(text))
        return frozenset(parsed) if origin is frozenset else parsed
    raise TypeError(f"no text form for a setting of type {tp!r}")  # a new field's type: add it


def _items(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _size(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if m is None:
        raise ValueError("expected sizes as HxW[,HxW]")
    return int(m[1]), int(m[2])


def _ice_servers(text: str) -> tuple[IceServer, ...]:
    if not text.strip():
        return ()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"expected a JSON list of ICE servers: {exc}") from None
    if not isinstance(raw, list):
        raise ValueError("expected a JSON list of ICE servers")
    out = []
    for obj in raw:
        if not isinstance(obj, dict) or "urls" not in obj:
            raise ValueError(f"an ICE server is a map with urls, got {obj!r}")
        urls = obj["urls"]
        out.append(IceServer((urls,) if isinstance(urls, str) else tuple(urls),
                             obj.get("username"), obj.get("credential")))
    return tuple(out)


def _is_list(tp: Any) -> bool:
    if get_origin(tp) in (Union, types.UnionType):
        return any(_is_list(a) for a in get_args(tp) if a is not type(None))
    return get_origin(tp) in (tuple, frozenset)


def _argtype(o: Option) -> Callable[[str], object]:
    def convert(text: str) -> object:
        try:
            return o.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc}, got {text!r}") from None

    convert.__name__ = o.dest
    return convert


def _metavar(o: Option) -> str:
    tp = o.type
    if get_origin(tp) in (Union, types.UnionType):
        (tp,) = [a for a in get_args(tp) if a is not type(None)]
    if get_origin(tp) in (tuple, frozenset):
        item = get_args(tp)[0]
        if item is IceServer:
            return "JSON"
        if item == tuple[int, int]:
            return "HxW[,HxW]"
        return f"{_metavar_of(item)}[,...]"
    return _metavar_of(tp)


def _metavar_of(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return "{" + ",".join(map(str, get_args(tp))) + "}"
    return {int: "N", float: "X", str: "TEXT", Path: "PATH"}.get(tp, "VALUE")


class _Extend(argparse.Action):
    """A list flag: each occurrence adds its comma-separated items."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        prior = getattr(namespace, self.dest, None)
        if isinstance(prior, tuple | frozenset) and isinstance(values, tuple | frozenset):
            values = type(values)((*prior, *values))
        setattr(namespace, self.dest, values)  # None: the empty value of an optional list


def _make(cls: type, prefix: tuple[str, ...], values: dict[tuple[str, ...], object],
          sources: dict[tuple[str, ...], str]) -> object:
    hints = get_type_hints(cls)
    kwargs: dict[str, object] = {}
    for f in fields(cls):
        path = (*prefix, f.name)
        tp = hints[f.name]
        if isinstance(tp, type) and is_dataclass(tp) and tp is not IceServer:
            kwargs[f.name] = _make(tp, path, values, sources)
        elif path in values:
            kwargs[f.name] = values[path]
    try:
        return cls(**kwargs)
    except ValueError as exc:
        named = [sources[(*prefix, f.name)] for f in fields(cls)
                 if (*prefix, f.name) in sources and re.search(rf"\b{f.name}\b", str(exc))]
        raise ValueError(f"{exc} (set by {', '.join(named)})" if named else str(exc)) from None
