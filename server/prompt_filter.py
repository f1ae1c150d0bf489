"""The prompt filter: every prompt is checked before it costs any model time.

A prompt enters a worker in two places, and both are screened here: a session's ``start``
(the WebSocket's message and the WebRTC offer's ``start``; ``Service.start``, before a
start frame is made or the engine admits anything) and a prompt switch (the ``prompt``
message, on the WebSocket or a WebRTC data channel; ``Inputs.prompt``, before the scene
changes). A fork of a saved world takes the world's prompt, which was screened when its
session started. A refused prompt is a ``PromptRefused`` (``prompt_refused`` on the wire,
docs/protocol.md): a refused start opens no session, a refused switch leaves the session
on its last prompt, streaming.

Two checks, either or both, in this order:

- A blocklist file (``--prompt-blocklist``, read once at start-up): one entry a line, ``#``
  starts a comment. A word (or phrase) matches case-insensitively as a whole word: ``fire``
  matches "Fire!" and not "firefly". ``re:`` starts a Python regular expression, searched
  anywhere in the prompt, case-insensitively. A pattern that does not compile stops the
  server, naming the file and the line.
- The operator's own check (``--prompt-filter module:callable``, imported at start-up): a
  callable taking the prompt's text and returning None to allow it or a short reason to
  refuse it. It runs on a thread pool of its own (a slow classifier holds neither the event
  loop nor the threads the server's other work uses), at most ``--prompt-filter-timeout-s``
  per prompt: past that, or if it raises or returns anything but None or a string, the
  prompt is refused (the filter fails closed) and the log says why.

Each refusal is counted (``worldserve_prompts_refused_total{where="start"|"switch"}``) and
logged with its session (for a switch), where and the reason; the prompt's text only with
``--log-refused-prompts``.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from worldserve.protocol import ErrorCode, ProtocolError
from worldserve.server.metrics import Metrics
from worldserve.server.settings import Settings

log = logging.getLogger("worldserve.prompts")

Check = Callable[[str], "str | None"]  # the prompt's text -> None (allowed) or why it is refused
Where = Literal["start", "switch"]
MAX_REASON_CHARS = 200  # a reason longer than this is cut (it goes to the client and the log)
TIMED_OUT = "filter timed out"
FAILED = "filter failed"
CHECK_THREADS = 4  # the operator's check runs on at most this many threads at once


class PromptRefused(ProtocolError):
    """A prompt the filter refused (``prompt_refused``, field ``prompt``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the prompt was refused: {reason}", "prompt", ErrorCode.PROMPT_REFUSED)
        self.why = reason


@dataclass(frozen=True, slots=True)
class Blocklist:
    """Words and patterns a prompt may not contain (see the module docstring)."""

    source: str  # the file it was read from, for the reasons and errors
    words: dict[str, int]  # casefolded word -> its line
    patterns: tuple[tuple[int, re.Pattern[str]], ...]  # (line, pattern)
    any_word: re.Pattern[str] | None  # every word, one alternation, whole words only

    @classmethod
    def parse(cls, text: str, source: str = "<blocklist>") -> Blocklist:
        """The blocklist ``text`` spells; ValueError naming ``source`` and the line of a bad
        pattern."""
        words: dict[str, int] = {}
        patterns: list[tuple[int, re.Pattern[str]]] = []
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("re:"):
                expr = line[3:].strip()
                try:
                    patterns.append((n, re.compile(expr, re.IGNORECASE)))
                except re.error as exc:
                    raise ValueError(f"prompt blocklist {source} line {n}: bad pattern {expr!r}: {exc}") from None
            else:
                words.setdefault(line.casefold(), n)
        any_word = None
        if words:  # longest first, so a phrase wins over a word it starts with
            alternation = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
            any_word = re.compile(rf"(?<!\w)(?:{alternation})(?!\w)", re.IGNORECASE)
        return cls(source, words, tuple(patterns), any_word)

    @classmethod
    def load(cls, path: Path) -> Blocklist:
        """The blocklist in the file ``path`` (UTF-8); ValueError naming a file that cannot be
        read or the line of a bad pattern."""
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"prompt blocklist {path}: cannot be read: {exc}") from None
        return cls.parse(text, str(path))

    def __len__(self) -> int:
        return len(self.words) + len(self.patterns)

    def check(self, prompt: str) -> str | None:
        """None, or why ``prompt`` is refused (the entry's line, not the words matched)."""
        if self.any_word is not None:
            m = self.any_word.search(prompt)
            if m is not None:
                return f"blocked (blocklist line {self.words.get(m.group(0).casefold(), '?')})"
        for n, pattern in self.patterns:
            if pattern.search(prompt):
                return f"blocked (blocklist line {n})"
        return None


def load_check(spec: str) -> Check:
    """The callable ``spec`` names (``package.module:attribute``, the attribute may be dotted);
    ValueError saying which part is wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise ValueError(f"prompt filter {spec!r}: expected module:callable, e.g. mypkg.moderation:check")
    try:
        obj: object = importlib.import_module(module_name.strip())
    except Exception as exc:  # ImportError, or whatever the module raised as it loaded
        raise ValueError(f"prompt filter {spec!r}: cannot import {module_name.strip()!r}: "
                         f"{type(exc).__name__}: {exc}") from None
    for part in attr.strip().split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"prompt filter {spec!r}: {module_name.strip()!r} has no {attr.strip()!r}") from None
    if not callable(obj):
        raise ValueError(f"prompt filter {spec!r}: {attr.strip()!r} is a {type(obj).__name__}, not a callable")
    return obj  # callable; its signature is the operator's


@dataclass(frozen=True, slots=True)
class PromptChecks:
    """What the filter checks, loaded at start-up (a file read, a module imported): do it
    before the event loop runs, or off it."""

    blocklist: Blocklist | None = None
    check: Check | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> PromptChecks:
        """The blocklist and the check ``settings`` name; ValueError saying what is wrong."""
        blocklist = Blocklist.load(settings.prompt_blocklist) if settings.prompt_blocklist is not None else None
        check = load_check(settings.prompt_filter) if settings.prompt_filter else None
        return cls(blocklist, check)


class PromptFilter:
    """Screens prompts with ``checks``: counts and logs each refusal (see the module
    docstring). ``close()`` stops the check's threads."""

    def __init__(self, checks: PromptChecks, settings: Settings, metrics: Metrics) -> None:
        self.checks = checks
        self.timeout_s = settings.prompt_filter_timeout_s
        self.log_text = settings.log_refused_prompts
        self.metrics = metrics
        self._pool: ThreadPoolExecutor | None = None
        if checks.check is not None:
            self._pool = ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="worldserve-prompt-filter")

    async def screen(self, prompt: str, where: Where, sid: str | None = None) -> None:
        """Return if ``prompt`` may be used; ``PromptRefused`` if not (counted and logged)."""
        reason = self.checks.blocklist.check(prompt) if self.checks.blocklist is not None else None
        if reason is None and self.checks.check is not None:
            reason = await self._run_check(self.checks.check, prompt, where, sid)
        if reason is None:
            return
        self.metrics.prompts_refused.labels(where).inc()
        extra: dict[str, object] = {"sid": sid, "where": where, "reason": reason}
        if self.log_text:
            extra["prompt"] = prompt
        log.info("prompt refused", extra=extra)
        raise PromptRefused(reason)

    async def _run_check(self, check: Check, prompt: str, where: Where, sid: str | None) -> str | None:
        if self._pool is None:  # closed: the server is stopping
            return FAILED
        loop = asyncio.get_running_loop()
        try:
            verdict = await asyncio.wait_for(loop.run_in_executor(self._pool, check, prompt), self.timeout_s)
        except TimeoutError:
            log.warning("prompt filter timed out", extra={"sid": sid, "where": where, "timeout_s": self.timeout_s})
            return TIMED_OUT
        except Exception as exc:  # its message may quote the prompt: the type only
            log.error("prompt filter raised %s", type(exc).__name__, extra={"sid": sid, "where": where})
            return FAILED
        if verdict is None:
            return None
        if not isinstance(verdict, str):
            log.error("prompt filter returned a %s (None or a reason string expected)", type(verdict).__name__,
                      extra={"sid": sid, "where": where})
            return FAILED
        return verdict.strip()[:MAX_REASON_CHARS] or "refused by the filter"

    def close(self) -> None:
        """Stop the check's threads (one still running a check finishes on its own)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
