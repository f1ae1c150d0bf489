"""A fresh session's start frame is made off the model thread and reaches the runner as the
session's observation: opening a session does not hold up the running sessions' chunks."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np

from tests.polling import until
from tests.server.harness import frames, recv_type, send, serve
from worldserve.protocol import Image, Resume, Resumed, Start, Started
from worldserve.server.settings import Settings
from worldserve.session.fake_runner import FakeRunner, LinearCost
from worldserve.session.plan import Capabilities, ModelState, StepOutput, StepPlan


class AnchoredRunner(FakeRunner):
    """A fake runner whose sessions start from a rendered frame, as the default model's do."""

    def __init__(self) -> None:
        super().__init__(cost=LinearCost({64: (0.002, 0.0005), 128: (0.004, 0.001)}), sleep=time.sleep)
        self.rendered_on: list[str] = []
        self.opened_with: dict[str, np.ndarray | None] = {}
        self.readied: list[tuple[str, np.ndarray]] = []  # (thread, frame) of ready_observation
        self.restores: list[tuple[str, ModelState]] = []  # (thread, snapshot) of ready_restore
        self.restored_from: dict[str, ModelState | None] = {}
        self.exported: list[str] = []  # sessions whose state was exported (suspended)

    @property
    def capabilities(self) -> Capabilities:
        return replace(super().capabilities, ready_observation=True, ready_restore=True)

    def ready_observation(self, scene: str, seed: int, bucket: int, frame: np.ndarray) -> None:
        self.readied.append((threading.current_thread().name, frame))

    def ready_restore(self, state: ModelState) -> None:
        self.restores.append((threading.current_thread().name, state))

    def first_frame(self, scene: str, seed: int, bucket: int) -> np.ndarray | None:
        self.rendered_on.append(threading.current_thread().name)
        return np.full((bucket, bucket, 3), seed % 256, np.uint8)

    def export_state(self, session_id: str) -> ModelState:
        state = super().export_state(session_id)
        self.exported.append(session_id)
        return state

    def execute(self, plan: StepPlan) -> StepOutput:
        for spec in plan.new_sessions:
            self.opened_with[spec.session_id] = spec.observation
            self.restored_from[spec.session_id] = spec.restore
        return super().execute(plan)


async def test_the_start_frame_is_rendered_off_the_model_thread() -> None:
    runner = AnchoredRunner()

    def factory(settings: Settings) -> AnchoredRunner:
        return runner

    async with serve(runner_factory=factory) as s:
        ws = await s.connect()
        await send(ws, Start(prompt="forest", seed=7, bucket=64, fps=20.0))
        started = await recv_type(ws, Started)
        assert isinstance(started, Started)
        obs = await _opened(runner, started.session_id)
        assert obs is not None and obs.shape == (64, 64, 3) and int(obs[0, 0, 0]) == 7
        assert len(runner.rendered_on) == 1
        assert not runner.rendered_on[0].startswith("worldserve-model"), runner.rendered_on


async def test_a_client_observation_is_not_replaced() -> None:
    runner = AnchoredRunner()
    async with serve(runner_factory=lambda settings: runner) as s:
        ws = await s.connect()
        img = np.full((64, 64, 3), 200, np.uint8)
        await send(ws, Start(prompt="forest", seed=7, bucket=64, fps=20.0,
                             observation=Image("raw", img.tobytes(), (64, 64, 3), "uint8")))
        started = await recv_type(ws, Started)
        assert isinstance(started, Started)
        obs = await _opened(runner, started.session_id)
        assert obs is not None and int(obs[0, 0, 0]) == 200
        assert runner.rendered_on == []  # nothing rendered for a session that brings its frame
        # the runner's work on that frame (a canvas's ground) was done before it opened, off its thread
        assert len(runner.readied) == 1 and np.array_equal(runner.readied[0][1], obs)
        assert not runner.readied[0][0].startswith("worldserve-model"), runner.readied


async def test_a_resumed_session_s_snapshot_is_made_ready_off_the_model_thread_before_it_is_restored() -> None:
    runner = AnchoredRunner()
    async with serve(runner_factory=lambda settings: runner) as s:
        ws = await s.connect()
        await send(ws, Start(prompt="forest", seed=7, bucket=64, fps=40.0, codec="raw"))
        started = await recv_type(ws, Started)
        assert isinstance(started, Started)
        got = await frames(ws, 6)
        sid = started.session_id
        await ws.close()  # dropped: the session is suspended, its state exported
        await until(lambda: sid in runner.exported, what="the dropped session's state exported")
        assert runner.restores == []  # suspending readies nothing
        ws2 = await s.connect()
        await send(ws2, Resume(sid, started.token, got[-1].block_idx + 1))
        assert isinstance(await recv_type(ws2, Resumed), Resumed)
        # the frames first received may be replayed blocks: wait for the runner to reopen it
        await until(lambda: runner.restored_from[sid] is not None, what="the session reopened")
        await frames(ws2, 2)
        # the runner was handed the very snapshot it then restored from, on a worker thread, first
        restored = runner.restored_from[sid]
        assert restored is not None and len(runner.restores) == 1
        thread, state = runner.restores[0]
        assert state is restored and not thread.startswith("worldserve-model"), thread


async def _opened(runner: AnchoredRunner, sid: str) -> np.ndarray | None:
    await until(lambda: sid in runner.opened_with, what=f"{sid} reaching the runner")
    return runner.opened_with[sid]
