"""A session's frame rate: the client's when its ``start`` names one, else the model's own
(``Capabilities.fps``: the rate its frames were made to play at), stated in ``started``; a v1
client that always sends ``fps`` (older SDKs: 24) is served as it asks."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgpack
import pytest

from tests.server.harness import recv_type, send, serve
from worldserve.protocol import PROTOCOL_VERSION, Start, Started, decode_client
from worldserve.server.settings import Settings
from worldserve.session.fake_runner import FakeRunner, LinearCost
from worldserve.session.plan import Runner


def runner_at(fps: float | None) -> Callable[[Settings], Runner]:
    def make(settings: Settings) -> Runner:
        return FakeRunner(cost=LinearCost({64: (0.002, 0.0005), 128: (0.004, 0.001)}), sleep=time.sleep, fps=fps)

    return make


def test_a_start_without_fps_leaves_it_to_the_server_and_one_with_fps_keeps_it() -> None:
    def wire(**fields: object) -> bytes:
        return msgpack.packb({"type": "start", "v": PROTOCOL_VERSION, **fields})

    assert decode_client(wire()).fps is None  # type: ignore[union-attr]
    assert decode_client(wire(fps=None)).fps is None  # type: ignore[union-attr]
    assert decode_client(wire(fps=24)).fps == 24.0  # type: ignore[union-attr]
    assert Start().fps is None and Start(fps=16.0).fps == 16.0


@pytest.mark.parametrize(("model_fps", "asked", "served"), [
    (16.0, None, 16.0),  # the model's own rate (a Wan recipe's)
    (12.0, None, 12.0),  # Matrix-Game's
    (16.0, 24.0, 24.0),  # an explicit fps wins: motion plays 1.5x fast
    (None, None, 24.0),  # a model that names none: 24
])
async def test_a_session_runs_at_the_fps_it_asks_for_else_at_the_model_s_and_started_says_which(
    model_fps: float | None, asked: float | None, served: float,
) -> None:
    async with serve(runner_factory=runner_at(model_fps)) as s:
        ws = await s.connect()
        await send(ws, Start("a forest", fps=asked, bucket=64))
        started = await recv_type(ws, Started)
        assert isinstance(started, Started) and started.fps == served
        live = s.service.live(started.session_id)
        assert live is not None and live.settings.fps == served
        await ws.close()
