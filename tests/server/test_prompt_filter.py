"""The prompt filter (server/prompt_filter.py): a blocklist and the operator's own check
screen every prompt, at start and at a switch, before it costs model time."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import cast

import aiohttp
import pytest

from tests.polling import until
from tests.server.harness import TEST_SETTINGS, Served, frames, recv_type, send, serve
from worldserve.cli.main import main as cli_main
from worldserve.protocol import Ack, Error, Prompt, Start, Started
from worldserve.server.logs import KeyValueFormatter
from worldserve.server.prompt_filter import Blocklist, PromptChecks, load_check
from worldserve.session.fake_runner import FakeRunner

BLOCKLIST = """\
# words match whole words, any case; re: lines are patterns
dragon
burning city
re:\\bkill\\w*
"""
BLOCKED = Blocklist.parse(BLOCKLIST, "blocklist.txt")
RELEASE = threading.Event()  # lets a slow check's thread finish at the end of its test
NOT_A_CALLABLE = 42


def no_castles(prompt: str) -> str | None:
    """An operator's check: refuses castles, allows the rest."""
    return "castles are not served here" if "castle" in prompt.lower() else None


def slow(prompt: str) -> str | None:
    RELEASE.wait(10.0)
    return None


def raising(prompt: str) -> str | None:
    raise RuntimeError(f"classifier down while reading {prompt!r}")


def runner_scene(s: Served, sid: str) -> str:
    """The scene the model side holds for the session (what its frames are made from)."""
    engine = s.service.engine
    assert engine is not None
    return cast(FakeRunner, engine.runner).sessions[sid].scene


async def refusal(ws: aiohttp.ClientWebSocketResponse) -> Error:
    err = await recv_type(ws, Error)
    assert isinstance(err, Error) and err.code == "prompt_refused" and err.field == "prompt", err
    assert not err.fatal
    return err


async def metric(s: Served, where: str) -> float:
    async with s.http.get(s.url("/metrics")) as resp:
        text = await resp.text()
    line = next(ln for ln in text.splitlines() if ln.startswith(f'worldserve_prompts_refused_total{{where="{where}"}}'))
    return float(line.split()[-1])


def test_blocklist_words_match_whole_words_in_any_case_and_patterns_anywhere() -> None:
    assert BLOCKED.check("A DRAGON flies") == "blocked (blocklist line 2)"
    assert BLOCKED.check("dragon!") == "blocked (blocklist line 2)"
    assert BLOCKED.check("a dragonfly over a pond") is None  # whole words only
    assert BLOCKED.check("the Burning City at dusk") == "blocked (blocklist line 3)"
    assert BLOCKED.check("a burning candle in a city") is None
    assert BLOCKED.check("killers in the fog") == "blocked (blocklist line 4)"
    assert BLOCKED.check("a skilled smith") is None  # the pattern's \b
    assert BLOCKED.check("") is None and len(BLOCKED) == 3


def test_a_bad_blocklist_pattern_fails_start_up_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "blocklist.txt"
    path.write_text("# ok\ndragon\nre:(unclosed\n")
    with pytest.raises(ValueError, match=r"blocklist .*blocklist.txt line 3: bad pattern '\(unclosed'"):
        PromptChecks.from_settings(replace(TEST_SETTINGS, prompt_blocklist=path))
    with pytest.raises(SystemExit, match=r"worldserve serve: prompt blocklist .*blocklist.txt line 3: bad pattern"):
        cli_main(["serve", "--prompt-blocklist", str(path)])
    with pytest.raises(ValueError, match=r"blocklist .*missing.txt: cannot be read"):
        PromptChecks.from_settings(replace(TEST_SETTINGS, prompt_blocklist=tmp_path / "missing.txt"))


def test_the_operators_check_is_loaded_by_import_path_and_errors_say_what_is_wrong() -> None:
    here = __name__
    assert load_check(f"{here}:no_castles") is no_castles
    checks = PromptChecks.from_settings(replace(TEST_SETTINGS, prompt_filter=f"{here}:no_castles"))
    assert checks.check is no_castles and checks.blocklist is None
    for spec, said in [
        ("no_castles", "expected module:callable"),
        ("tests.server.no_such_module:check", "cannot import 'tests.server.no_such_module'"),
        (f"{here}:missing", "has no 'missing'"),
        (f"{here}:NOT_A_CALLABLE", "'NOT_A_CALLABLE' is a int, not a callable"),
    ]:
        with pytest.raises(ValueError, match=said):
            load_check(spec)


async def test_a_blocked_start_opens_no_session_and_the_connection_may_start_again() -> None:
    async with serve(prompt_checks=PromptChecks(BLOCKED)) as s:
        ws = await s.connect()
        for prompt in ("a dragon over the hills", "where the killer waits"):  # a word, a pattern
            await send(ws, Start(prompt=prompt, fps=20.0))
            err = await refusal(ws)
            assert "blocklist line" in err.message
            assert len(s.service.store) == 0 and not list(s.service.table)
            engine = s.service.engine
            assert engine is not None and not cast(FakeRunner, engine.runner).sessions  # no model time
        await send(ws, Start(prompt="a green valley", fps=20.0))
        started = await recv_type(ws, Started)
        await frames(ws, 2)
        assert isinstance(started, Started) and runner_scene(s, started.session_id) == "a green valley"
        assert await metric(s, "start") == 2 and await metric(s, "switch") == 0


async def test_a_blocked_switch_keeps_the_session_on_its_prompt_and_streaming() -> None:
    async with serve(prompt_checks=PromptChecks(BLOCKED)) as s:
        ws = await s.connect()
        await send(ws, Start(prompt="a green valley", fps=20.0))
        started = await recv_type(ws, Started)
        assert isinstance(started, Started)
        sid = started.session_id
        await frames(ws, 2)
        await send(ws, Prompt("the burning city", id=5))
        await refusal(ws)
        live = s.service.live(sid)
        assert live is not None and live.session.scene == "a green valley"
        assert runner_scene(s, sid) == "a green valley"
        before = (await frames(ws, 1))[0].frame
        assert (await frames(ws, 3))[-1].frame > before  # still streaming
        await send(ws, Prompt("a snowy valley", id=6))
        assert await recv_type(ws, Ack) == Ack("prompt", 6)
        await until(lambda: runner_scene(s, sid) == "a snowy valley")
        assert await metric(s, "switch") == 1 and await metric(s, "start") == 0


async def test_a_refusal_is_logged_without_the_prompts_text_unless_asked(caplog: pytest.LogCaptureFixture) -> None:
    text = "a dragon named Quillbert"
    for log_text in (False, True):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="worldserve.prompts"):
            async with serve(prompt_checks=PromptChecks(BLOCKED), log_refused_prompts=log_text) as s:
                ws = await s.connect()
                await send(ws, Start(prompt="a green valley", fps=20.0))
                await recv_type(ws, Started)
                await send(ws, Prompt(text, id=1))
                await refusal(ws)
        (record,) = [r for r in caplog.records if r.name == "worldserve.prompts"]
        line = KeyValueFormatter().format(record)
        assert "where=switch" in line and "blocklist line 2" in line and "sid=" in line
        assert ("Quillbert" in line) is log_text, line


async def test_the_operators_check_refuses_and_allows_at_start_and_switch() -> None:
    async with serve(prompt_checks=PromptChecks(check=no_castles)) as s:
        ws = await s.connect()
        await send(ws, Start(prompt="a castle on a hill", fps=20.0))
        err = await refusal(ws)
        assert err.message == "the prompt was refused: castles are not served here"
        await send(ws, Start(prompt="a hill", fps=20.0))
        started = await recv_type(ws, Started)
        assert isinstance(started, Started)
        await frames(ws, 1)
        await send(ws, Prompt("a sand castle", id=2))
        await refusal(ws)
        assert runner_scene(s, started.session_id) == "a hill"
        await send(ws, Prompt("a sand dune", id=3))
        assert await recv_type(ws, Ack) == Ack("prompt", 3)


async def test_the_settings_load_the_blocklist_and_the_check_the_server_uses(tmp_path: Path) -> None:
    path = tmp_path / "blocklist.txt"
    path.write_text(BLOCKLIST)
    settings = replace(TEST_SETTINGS, prompt_blocklist=path, prompt_filter=f"{__name__}:no_castles")
    checks = await asyncio.to_thread(PromptChecks.from_settings, settings)  # start-up: off the loop
    async with serve(settings, prompt_checks=checks) as s:
        ws = await s.connect()
        for prompt in ("a dragon", "a castle"):
            await send(ws, Start(prompt=prompt, fps=20.0))
            await refusal(ws)
        assert await metric(s, "start") == 2


async def test_a_slow_check_times_out_and_refuses_without_holding_the_loop() -> None:
    RELEASE.clear()
    try:
        async with serve(prompt_checks=PromptChecks(check=slow), prompt_filter_timeout_s=0.2) as s:
            ws = await s.connect()
            t0 = time.monotonic()
            await send(ws, Start(prompt="a meadow", fps=20.0))
            err = await refusal(ws)
            assert err.message == "the prompt was refused: filter timed out"
            assert time.monotonic() - t0 < 5.0 and len(s.service.store) == 0
            async with s.http.get(s.url("/healthz")) as resp:  # the loop kept serving
                assert resp.status == 200
    finally:
        RELEASE.set()


async def test_a_check_that_raises_refuses_and_its_message_stays_out_of_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="worldserve.prompts"):
        async with serve(prompt_checks=PromptChecks(check=raising)) as s:
            ws = await s.connect()
            await send(ws, Start(prompt="a secret meadow", fps=20.0))
            err = await refusal(ws)
            assert err.message == "the prompt was refused: filter failed"
    lines = [KeyValueFormatter().format(r) for r in caplog.records if r.name == "worldserve.prompts"]
    assert any("RuntimeError" in ln for ln in lines) and not any("secret" in ln for ln in lines)
