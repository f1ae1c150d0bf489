"""Structured logs: one line per record, key=value (logfmt) or JSON.

Fields passed with ``extra={...}`` (``sid`` above all) become keys of the line, so every
line about a session carries its id: ``log.info("session started", extra={"sid": sid})``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key, value in vars(record).items():
        if key not in _STANDARD and not key.startswith("_"):
            out[f"x_{key}" if key in out else key] = value  # never overwrite ts/level/msg
    if record.exc_info:
        out["exc"] = logging.Formatter().formatException(record.exc_info)
    return out


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), default=str)


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_quote(v)}" for k, v in _fields(record).items())


def _quote(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and not any(c in text for c in ' ="\n\t'):
        return text
    return json.dumps(text)


def configure(fmt: str = "kv", level: str = "INFO") -> None:
    """Send every logger's records to stderr as structured lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
