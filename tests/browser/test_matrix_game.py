"""The browser page steers a ``--model matrix-game-2`` server (a tiny random ``--weights``
directory) end to end: it shows the controls the model takes; a key held in the page reaches
the action modules' inputs frame by frame (each latent frame's window of pixel-frame keys, as
the action path says), and the blocks made from then on differ from the same session's with
no key held, while the blocks before the key are the same, frame for frame, down to the
frames the page received."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from tests.browser.browser import chromium
from tests.browser.test_browser import STATE, picture, until
from tests.model.wan.tiny_mg_dir import HEIGHT, WIDTH, build_tiny_mg_dir
from tests.rtc.harness import serve_rtc
from worldserve.server.app import load_model_runner
from worldserve.server.keys import SERVICE
from worldserve.server.settings import Settings
from worldserve.session.plan import Runner, StepOutput, StepPlan

FORWARD = 0  # column of the held-key vector (protocol/vocab.py KEYS) and of the universal keyboard (W)


@pytest.fixture(scope="module")
def mg_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_mg_dir(tmp_path_factory.mktemp("mg"))


@dataclass
class Made:
    """What the model was given and made, per session and block (generation only)."""

    actions: dict[str, dict[int, np.ndarray]] = field(default_factory=lambda: defaultdict(dict))
    frames: dict[str, dict[int, np.ndarray]] = field(default_factory=lambda: defaultdict(dict))
    steps: dict[str, dict[int, int]] = field(default_factory=lambda: defaultdict(dict))
    # the action modules' keyboard input: (first latent frame, windows (F, W, keyboard_dim_in))
    keyboard: dict[str, list[tuple[int, np.ndarray]]] = field(default_factory=lambda: defaultdict(list))


def recording(made: Made):
    """A runner factory: the server's own loader, with the runner's chunks recorded."""

    def factory(settings: Settings) -> Runner:
        runner: Any = load_model_runner(settings)
        execute, chunk_inputs = runner.execute, runner._chunk_inputs

        def recorded_execute(plan: StepPlan) -> StepOutput:
            out = execute(plan)
            for batch in plan.batches:
                for it in batch.items:
                    made.actions[it.session_id][it.block_idx] = it.actions.copy()
                    made.steps[it.session_id][it.block_idx] = batch.steps
            for r in out.results:
                made.frames[r.session_id][r.block_idx] = r.frames.copy()
            return out

        def recorded_inputs(states: list[Any], ctx: Any, actions: Any) -> dict[str, object]:
            extra = chunk_inputs(states, ctx, actions)
            if actions is not None:  # a generated chunk (not a re-cache)
                ids = {id(s): sid for sid, s in runner.sessions.items()}
                keyboard = extra["act"].keyboard.float().cpu().numpy()  # type: ignore[attr-defined]
                for b, s in enumerate(states):
                    made.keyboard[ids[id(s)]].append((int(ctx.start_frames[b]), keyboard[b]))
            return extra

        runner.execute, runner._chunk_inputs = recorded_execute, recorded_inputs
        return runner

    return factory


def mg_settings(weights: Path, made: Made) -> dict[str, Any]:
    return dict(
        model="matrix-game-2", weights=weights, sizes=((HEIGHT, WIDTH),), dtype="float32", threads=1,
        warmup_batch_sizes=(1, 2), warmup_steps=(3,), admission_threshold=4.0, capacity=4,
        min_steps=3,  # the ladder never takes a step away: blocks of two sessions compare as made
        runner_factory=recording(made),
    )


def page_frames(page: Any) -> dict[int, str]:
    """The JPEG frames the page receives over the WebSocket: frame index -> digest."""
    got: dict[int, str] = {}

    def on_socket(ws: Any) -> None:
        def on_frame(payload: bytes | str) -> None:
            if isinstance(payload, bytes):
                msg = msgpack.unpackb(payload, raw=False)
                if isinstance(msg, dict) and msg.get("type") == "frame":
                    got[msg["frame"]] = hashlib.sha256(msg["data"]).hexdigest()

        ws.on("framereceived", on_frame)

    page.on("websocket", on_socket)
    return got


async def open_page(ctx: Any, url: str, made: Made, transport: str) -> tuple[Any, str, dict[int, str], list[Any]]:
    page = await ctx.new_page()
    errors: list[Any] = []
    page.on("pageerror", lambda e: errors.append(e))
    received = page_frames(page)
    await page.goto(f"{url}/?fps=8&seed=3&transport={transport}")
    await page.wait_for_function("window.worldserve.framesShown > 3", timeout=60000)
    state = await page.evaluate(STATE)
    assert state["transport"] == transport
    return page, state["session"]["id"], received, errors


def forward_blocks(made: Made, sid: str) -> list[int]:
    return sorted(b for b, a in made.actions[sid].items() if (a[:, FORWARD] > 0.5).any())


@pytest.mark.parametrize("transport", ["webrtc", "ws"])
async def test_a_key_held_in_the_page_steers_a_matrix_game_server(mg_weights: Path, transport: str) -> None:
    made = Made()
    async with serve_rtc(**mg_settings(mg_weights, made)) as (app, url), chromium() as ctx:
        # A session with W held from its third block on.
        page, held, held_got, errors = await open_page(ctx, url, made, transport)
        await page.wait_for_function(  # the overlay refreshes every 250 ms
            "document.getElementById('stat-controls').textContent !== '–'", timeout=30000)
        assert await page.inner_text("#stat-controls") == "keys, mouse, observation"
        assert await page.is_hidden("#prompt-form")  # Matrix-Game takes no text
        await until(lambda: len(made.frames[held]) >= 2, 60)
        element = "video" if transport == "webrtc" else "canvas"
        before = await picture(page, element)
        await page.keyboard.down("w")
        live = app[SERVICE].live(held)
        await until(lambda: live.action_seq >= 1, 30)
        await until(lambda: len(forward_blocks(made, held)) >= 4, 60)
        after = await picture(page, element)
        await page.keyboard.up("w")
        key = forward_blocks(made, held)[0]
        first_key_frame = 5 + 8 * (key - 1)  # block 0 holds 5 frames, every later one 8
        if transport == "ws":
            await until(lambda: max(held_got, default=0) >= first_key_frame + 16, 60)
        await page.close()
        assert not errors

        # The same page, the same seed, no key: the session the key steered away from.
        page, still, still_got, errors = await open_page(ctx, url, made, transport)
        last = max(made.frames[held])
        await until(lambda: len(made.frames[still]) > last, 60)
        if transport == "ws":
            await until(lambda: max(still_got, default=0) >= first_key_frame + 16, 60)
        await page.close()
        assert not errors

    assert before.std() > 0 and np.abs(before - after).mean() > 0  # the page's picture moved on
    assert key >= 1 and not forward_blocks(made, still)
    same_steps = [b for b in range(last + 1) if made.steps[held][b] == made.steps[still][b]]
    assert same_steps == list(range(last + 1))
    for b in range(key):  # before the key: the same blocks
        np.testing.assert_array_equal(made.frames[held][b], made.frames[still][b])
    diff = [float(np.abs(made.frames[held][b].astype(int) - made.frames[still][b]).mean())
            for b in range(key, last + 1)]
    assert diff[0] > 0 and max(diff) > 0.5, diff  # from the key's block on, steered away

    # The action path: the latent frame g's keyboard input is the keys of pixel frames
    # 4g - 12 .. 4g - 1 (frame 0's before frame 0), frame by frame as the page held them.
    # a block's actions are a row a display frame, the newest last; block 0 makes 5 frames, then 8
    rows = [made.actions[held][b][-(5 if b == 0 else 8):] for b in range(last + 1)]
    pixel_keys = np.concatenate(rows)[:, :4]
    fed = made.keyboard[held]
    assert [g for g, _ in fed] == [2 * b for b in range(last + 1)]  # one entry a block, 2 latent frames each
    for g0, windows in fed:
        f, w, _ = windows.shape
        pixel = np.maximum(4 * (g0 + np.arange(f))[:, None] - w + np.arange(w)[None, :], 0)  # (F, W)
        np.testing.assert_array_equal(windows, pixel_keys[pixel])
    assert fed[key + 2][1][:, :, FORWARD].all() and not fed[key - 1][1][:, :, FORWARD].any()

    if transport == "ws":  # what the page received: the same frames up to the key's block, then not
        shared = sorted(set(held_got) & set(still_got))
        assert any(f < first_key_frame for f in shared) and any(f >= first_key_frame + 8 for f in shared)
        assert all(held_got[f] == still_got[f] for f in shared if f < first_key_frame)
        assert any(held_got[f] != still_got[f] for f in shared if f >= first_key_frame)
