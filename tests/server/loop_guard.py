"""The event loop is never blocked: ``blockbuster`` in every async server test.

``blockbuster`` replaces blocking calls (``time.sleep``, file and blocking-socket I/O,
``os.stat`` and friends, a wait on a held ``threading.Lock``, ``input``) with checks that
raise ``BlockingError`` when they run on a thread whose event loop is running. Here it
watches the calls made from the server's packages (server/, session/; test code and
libraries called on their own are not its business), and it also watches the
codec calls that are not I/O but hold the loop for milliseconds: Pillow's image encoder
and decoder, our WebSocket frame encoders and the WebRTC encoder. Those belong on the
codec pool (server/offload.py) or aiortc's encoder thread.

A ``BlockingError`` raised inside the server is usually caught there (a handler answers
500, a writer logs and closes), so the guard also records every one it raises and fails
the test at teardown. Calls that are fine are allowed in ``ALLOWED`` below, each with the
reason; the allowlist is short on purpose: a blocking call in the server is moved off the
loop, not allowed.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import blockbuster.blockbuster as bb_module
from blockbuster import BlockBuster, BlockBusterFunction, BlockingError

# The server's packages (protocol/ is the clients' too: a test client may encode on its loop;
# the server's calls into protocol/ have server/ frames below them).
WATCHED = ["server", "session"]

# Codec work that is CPU, not I/O: blockbuster does not know it, so it is added here.
CODEC_CALLS = [
    "PIL.Image.Image.save",  # JPEG/PNG encode
    "PIL.Image.open",  # image decode (observations)
    "worldserve.server.encode.JpegEncoder.encode",
    "worldserve.server.encode.H264Encoder.encode",
    "worldserve.server.rtc.encoder.LatencyEncoder.encode",  # aiortc calls it on its executor thread
]

# (blockbuster's name for the call or "*" for all, file, functions in the stack where it
# may block, why)
ALLOWED: list[tuple[str, str, set[str], str]] = [
    ("*", "prometheus_client/process_collector.py", {"_boot_time", "collect"},
     "the process metrics read /proc/self: procfs answers from kernel memory, no disk"),
    ("threading.Lock.acquire", "aiortc/rtcrtpreceiver.py", {"__stop_decoder"},
     "closing a receiving peer (the Python client, bench/_rtc_client.py) joins aiortc's "
     "decoder thread, which ends at its next frame; a server peer only sends"),
    ("*", "logging/__init__.py", {"emit", "flush"},
     "log records go to stderr (server/logs.py), which blockbuster allows; under pytest "
     "stderr is a capture file"),
]


class LoopGuard:
    """A ``BlockBuster`` over the worldserve packages, with the codec calls, that keeps
    what it raised."""

    def __init__(self) -> None:
        self.raised: list[str] = []
        self.buster = BlockBuster(WATCHED)
        for name in CODEC_CALLS:
            owner, attr = _owner(name)
            fn = BlockBusterFunction(owner, attr, scanned_modules=WATCHED)
            fn.full_name = name
            self.buster.functions[name] = fn
        for name, filename, functions, _why in ALLOWED:
            for fn in self.buster.functions.values() if name == "*" else [self.buster.functions[name]]:
                fn.can_block_in(filename, functions)

    def take(self) -> list[str]:
        """The blocking calls caught since the last ``take`` (and forget them)."""
        raised, self.raised = self.raised, []
        return raised


def _owner(name: str) -> tuple[Any, str]:
    """("pkg.mod.Class.method") -> (the class, "method"), importing the module."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:-1]:
            owner = getattr(owner, attr)
        return owner, parts[-1]
    raise ValueError(f"cannot import any module of {name!r}")


def _where() -> str:
    """The innermost worldserve frames of the blocking call (file:line function)."""
    roots = tuple(importlib.import_module(name).__path__[0] + "/" for name in [*WATCHED, "protocol"])
    frames = [f for f in traceback.extract_stack()[:-3] if f.filename.startswith(roots)]
    return " <- ".join(f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}"
                       for f in reversed(frames[-3:]))


@contextmanager
def loop_guard() -> Iterator[LoopGuard]:
    guard = LoopGuard()
    # Every BlockingError the checks raise, also the ones the server catches, is kept.
    # blockbuster builds its error from its module's global name at each call.
    original = bb_module.BlockingError

    class Recorded(original):  # type: ignore[misc, valid-type]
        def __init__(self, func: str) -> None:
            super().__init__(func)
            guard.raised.append(f"{func} from {_where()}")

    bb_module.BlockingError = Recorded  # type: ignore[misc]
    guard.buster.activate()
    try:
        yield guard
    finally:
        guard.buster.deactivate()
        bb_module.BlockingError = original  # type: ignore[misc]


__all__ = ["BlockingError", "LoopGuard", "loop_guard"]
