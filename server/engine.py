"""The engine loop: ``schedule`` on the event loop, ``execute`` on the model thread, ``update``.

One asyncio task runs the loop; one dedicated executor thread owns the model, so model work
never blocks the event loop. The loop sleeps until the scheduler's next wake-up or until new
work arrives (``wake``: every session call that adds work does it). The engine emits
results: every event of a step, finished chunks (``ChunkReady``) included, goes to
``on_event`` as soon as the step is done. Where a chunk goes from there (the replay ring,
the transport, held until its display time) is the service's (server/engine_events.py).

``suspend(id)`` takes a session out of the schedule between two steps, so nothing of it
is in flight: it returns the next block_idx and the runner's ``ModelState`` (exported on
the model thread before the state is freed), enough to add the session back later with
``first_block`` and ``SessionSpec.restore`` and continue with no gap or repeat.
``export(id)`` is the same between-steps export with the session left running (periodic
snapshots for crash recovery).

Loop shape, as every background loop here: ``CancelledError`` exits quietly, other
exceptions are logged with the session ids, cleanup always runs, ``stop()`` cancels then
awaits.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass

import numpy as np

from worldserve.session.admission import Admission
from worldserve.session.degrade import Rung
from worldserve.session.plan import ModelState, Runner, SessionSpec, StepOutput, StepPlan
from worldserve.session.scheduler import Event, Mode, Scheduler

log = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class Suspension:
    """A session taken out of the schedule by ``Engine.suspend``."""

    session_id: str
    next_block: int  # the first block it has not generated
    state: ModelState | None  # the runner's state (None: it had none yet, or export failed)
    level: int  # its degradation level then
    settings: Rung  # what it ran at then


StepHook = Callable[[StepPlan, StepOutput, float], None]  # plan, output, wall seconds


def model_executor() -> ThreadPoolExecutor:
    """The single thread that owns the model (warm it up here, then hand it to the Engine)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="worldserve-model")


class Engine:
    """Drives a ``Scheduler`` and a ``Runner``; owns the model thread once started."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: Runner,
        *,
        clock: Callable[[], float] | None = None,
        executor: ThreadPoolExecutor | None = None,
        batching: bool = True,
        on_event: Callable[[Event], None] | None = None,
        on_step: StepHook | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self._clock = clock or scheduler.clock  # one clock for deadlines
        self._executor = executor  # shut down by stop(), whoever made it
        self._on_event = on_event
        self._on_step = on_step
        self._suspends: dict[str, asyncio.Future[Suspension]] = {}
        self._exports: dict[str, asyncio.Future[Suspension]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self.steps = 0  # plans executed
        self.failure: BaseException | None = None  # set if the loop died of a bug
        scheduler.set_batching(batching)

    # --- sessions (event-loop thread only) ---

    def add_session(
        self,
        session_id: str,
        spec: SessionSpec,
        *,
        fps: float,
        lookahead: int = 0,
        steps: int | None = None,
        mode: Mode = Mode.PUSH,
        priority: int = 0,
        first_block: int = 0,
    ) -> Admission:
        """Admit (see ``Scheduler.add_session``)."""
        verdict = self.scheduler.add_session(
            session_id,
            spec,
            fps=fps,
            lookahead=lookahead,
            steps=steps,
            mode=mode,
            priority=priority,
            now=self._clock(),
            first_block=first_block,
        )
        if verdict.admitted:
            self.wake()
        return verdict

    def remove_session(self, session_id: str) -> None:
        self.scheduler.remove_session(session_id)
        self.wake()

    async def suspend(self, session_id: str) -> Suspension:
        """Take a session out of the schedule between two steps and export its model
        state; KeyError if it is not scheduled."""
        if session_id not in self.scheduler:
            raise KeyError(f"session {session_id!r} is not scheduled")
        if not self.running:  # no step in flight: nothing to wait for (no state to export)
            return self._suspend_now(session_id, None)
        fut = self._suspends.get(session_id)
        if fut is None:
            fut = self._suspends[session_id] = asyncio.get_running_loop().create_future()
            fut.add_done_callback(_retrieve)  # a caller that gave up must not leave it unread
            self.wake()
        return await asyncio.shield(fut)

    async def export(self, session_id: str) -> Suspension:
        """``suspend`` without the removal: the session's next block_idx and model state,
        read between two steps; it keeps running. KeyError if it is not scheduled."""
        if session_id not in self.scheduler:
            raise KeyError(f"session {session_id!r} is not scheduled")
        if not self.running:
            return self._stats(session_id, None)
        fut = self._exports.get(session_id)
        if fut is None:
            fut = self._exports[session_id] = asyncio.get_running_loop().create_future()
            fut.add_done_callback(_retrieve)
            self.wake()
        return await asyncio.shield(fut)

    def set_scene(self, session_id: str, prompt: str) -> None:
        self.scheduler.set_scene(session_id, prompt)
        self.wake()

    def observe(self, session_id: str, frame: np.ndarray) -> None:
        self.scheduler.observe(session_id, frame)
        self.wake()

    def request_block(self, session_id: str, block_idx: int, deadline: float | None = None) -> bool:
        queued = self.scheduler.request_block(session_id, block_idx, deadline, self._clock())
        self.wake()
        return queued

    def wake(self) -> None:
        """New work: make the loop look at the scheduler now."""
        self._wake.set()

    # --- lifecycle ---

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("an engine starts once; make a new one")
        self._started = True
        if self._executor is None:
            self._executor = model_executor()
        self._task = asyncio.create_task(self._run(), name="worldserve-engine")

    async def stop(self) -> None:
        """Cancel the loop, wait for it and for the model thread; idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if me is not None and me.cancelling():
                    raise  # stop() itself was cancelled
        executor, self._executor = self._executor, None
        if executor is not None:  # a plan may still be running on it: wait off the loop
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown, True)

    # --- the loop ---

    async def _run(self) -> None:
        try:
            while True:
                self._wake.clear()
                if self._suspends or self._exports:
                    await self._run_suspends()
                now = self._clock()
                plan = self.scheduler.schedule(now)
                if plan.is_empty():
                    # update() with the empty plan, not take_events(): it also runs the
                    # degradation control tick. A session that skips every slot (its chunk
                    # costs more than a chunk period) yields only empty plans, and without
                    # the tick it would never be degraded to a rung it can make.
                    self._dispatch(self.scheduler.update(plan, StepOutput(), now))
                    await self._idle(now)
                    continue
                t0 = time.perf_counter()
                out = await self._execute(plan)
                self.steps += 1
                if self._on_step is not None:
                    self._call_step_hook(plan, out, time.perf_counter() - t0)
                self._dispatch(self.scheduler.update(plan, out, self._clock()))
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            self.failure = exc
            log.exception("engine loop failed; its sessions stop getting frames")
        finally:
            self._cleanup()

    async def _execute(self, plan: StepPlan) -> StepOutput:
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self.runner.execute, plan)
        except Exception as exc:  # the plan failed as a whole: each of its sessions gets the error
            ids = _session_ids(plan)
            log.exception("runner failed a plan; sessions %s", ids)
            return StepOutput(errors={sid: f"runner failed: {exc!r}" for sid in ids})

    async def _run_suspends(self) -> None:
        """Between steps (nothing in flight): export each state; unschedule the suspends."""
        exports, self._exports = self._exports, {}
        pending, self._suspends = self._suspends, {}
        try:
            for sid, fut in exports.items():
                if sid in pending:  # the suspend answers it too
                    pending[sid].add_done_callback(functools.partial(_chain, dst=fut))
                    continue
                state = await self._export_state(sid) if sid in self.scheduler else None
                if fut.done():
                    continue
                if sid in self.scheduler:
                    fut.set_result(self._stats(sid, state))
                else:
                    fut.set_exception(KeyError(f"session {sid!r} is not scheduled"))
            for sid, fut in pending.items():
                if sid not in self.scheduler:
                    if not fut.done():
                        fut.set_exception(KeyError(f"session {sid!r} is not scheduled"))
                    continue
                state = await self._export_state(sid)
                if sid in self.scheduler:
                    result = self._suspend_now(sid, state)
                    if not fut.done():
                        fut.set_result(result)
                elif not fut.done():
                    fut.set_exception(KeyError(f"session {sid!r} was removed while suspending"))
        finally:
            for fut in (*exports.values(), *pending.values()):
                if not fut.done():
                    fut.set_exception(RuntimeError("engine stopped while suspending"))

    async def _export_state(self, sid: str) -> ModelState | None:
        """The runner's state of ``sid``, read on the model thread; None if it has none."""
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, self.runner.export_state, sid)
        except KeyError:
            return None  # never opened in the runner: it restarts from its spec
        except Exception:
            log.exception("export_state failed for session %s; it resumes afresh", sid)
            return None

    def _stats(self, session_id: str, state: ModelState | None) -> Suspension:
        stats = self.scheduler.stats(session_id)
        return Suspension(session_id, stats.next_block, state, stats.level, stats.settings)

    def _suspend_now(self, session_id: str, state: ModelState | None) -> Suspension:
        result = self._stats(session_id, state)
        self.remove_session(session_id)
        return result

    def _call_step_hook(self, plan: StepPlan, out: StepOutput, seconds: float) -> None:
        assert self._on_step is not None
        try:
            self._on_step(plan, out, seconds)
        except Exception:
            log.exception("step hook failed; sessions %s", _session_ids(plan))

    async def _idle(self, now: float) -> None:
        delay = self.scheduler.next_wakeup(now) - now
        if delay == float("inf"):
            await self._wake.wait()
            return
        with suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), max(delay, 0.0005))

    def _dispatch(self, events: list[Event]) -> None:
        for ev in events:
            if self._on_event is not None:
                try:
                    self._on_event(ev)
                except Exception:
                    log.exception(
                        "event handler failed on %s for session %s",
                        type(ev).__name__,
                        getattr(ev, "session_id", None),
                    )

    def _cleanup(self) -> None:
        pending, self._suspends = self._suspends, {}
        exports, self._exports = self._exports, {}
        for fut in (*pending.values(), *exports.values()):
            if not fut.done():
                fut.set_exception(RuntimeError("engine stopped while suspending"))


def _retrieve(fut: asyncio.Future[Suspension]) -> None:
    if not fut.cancelled():
        fut.exception()


def _chain(src: asyncio.Future[Suspension], dst: asyncio.Future[Suspension]) -> None:
    """Answer ``dst`` as ``src`` was answered."""
    if dst.done():
        return
    if src.cancelled():
        dst.set_exception(RuntimeError("suspend cancelled"))
    elif (exc := src.exception()) is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(src.result())


def _session_ids(plan: StepPlan) -> list[str]:
    ids = {w.session_id for b in plan.batches for w in b.items}
    ids.update(s.session_id for s in plan.new_sessions)
    ids.update(u.session_id for u in plan.updates)
    return sorted(ids)
