"""The degradation ladder under a burst of contention: another process burns one core for a while.

    python -m bench.ladder_burn [--sessions N] [--before S] [--burn S] [--after S]
                                [--threads N] [--dtype D] [--weights PATH] [--no-cpu-trace] [--batch-sizes 1 2 4 8]

The real default model behind the engine, in-process, as ``bench.serve_load`` runs it: push
sessions at the smallest bucket asking for 24 fps at full quality with lookahead 1, degradation
on (the server's ``DegradeOptions``), a consumer per session draining its frames. After every
session has its first frame: ``--before`` seconds calm, then a separate process busy-loops on
one core for ``--burn`` seconds (10 by default: a browser or a build taking a core for a
moment), then ``--after`` seconds calm again. Every 50 ms it reads each session's ladder
level.

Prints a table per second (the highest level of any session, frames delivered per session,
misses: late chunks and skipped slots) and the ladder's moves, then the line

    ladder_burn max_level=<n> recover_s=<x> back_s=<x> burn_s=<x> calm_max_level=<n> moves=<n>

``max_level``: the highest level any session reached; ``recover_s``: seconds from the burn's
end until every session is at level 0 and stays there to the end (0 if none was degraded at
the end of the burn; ``inf`` if they never got back); ``back_s``: seconds from the burn's end
to the first moment every session is at level 0 (where it is below ``recover_s``, calm moved
them again later: a load at the machine's edge, which ``calm_max_level`` shows before the
burn too). The goal (issue 27): back at level 0
within 5 s of the burn's end. On a machine shared with other work the figures move with it.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing as mp
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path

import torch

from worldserve.bench._steer import steer
from worldserve.model.default.runner import ModelRunner
from worldserve.model.default.weights import DEFAULT_WEIGHTS
from worldserve.model.dtype import DTYPES
from worldserve.server.engine import Engine, model_executor
from worldserve.session.admission import AdmissionOptions
from worldserve.session.costmodel import CostModel
from worldserve.session.degrade import DegradationChanged, DegradeOptions
from worldserve.session.events import ChunkReady, DeadlineMiss, Event, FrameSkipped
from worldserve.session.plan import BatchTiming, SessionSpec
from worldserve.session.scheduler import Mode, RunnerInfo, Scheduler, SchedulerOptions
from worldserve.session.warmup import warm_up

BATCH_SIZES = (1, 2, 4, 8)
SAMPLE_S = 0.05


def burn(started: MpEvent, stop: MpEvent) -> None:
    """Busy-loop on one core until ``stop`` is set (run in another process)."""
    started.set()
    n = 0
    while not stop.is_set():
        for _ in range(20_000):
            n += 1


@dataclass
class BurnRun:
    t0: float  # every session had its first frame
    burn_start: float
    burn_end: float
    end: float
    levels: list[tuple[float, int]]  # (time, highest level of any session)
    frames: list[float] = field(default_factory=list)  # delivery times, all sessions
    misses: list[float] = field(default_factory=list)  # DeadlineMiss / FrameSkipped times
    moves: list[tuple[float, str, int, int, tuple[str, ...]]] = field(default_factory=list)

    @property
    def max_level(self) -> int:
        return max((lv for _, lv in self.levels), default=0)

    @property
    def calm_max_level(self) -> int:
        return max((lv for t, lv in self.levels if t < self.burn_start), default=0)

    @property
    def back_s(self) -> float:
        """Seconds from the burn's end to the first sample at level 0 (0 if the ladder was
        there when it ended; ``inf`` if never). Where it is below ``recover_s`` the ladder
        went back to level 0 and later left it again, in calm: a load at the machine's edge,
        not the burn."""
        back = next((t for t, lv in self.levels if t >= self.burn_end and lv == 0), None)
        return math.inf if back is None else back - self.burn_end

    @property
    def recover_s(self) -> float:
        """Seconds from the burn's end to the last sample above level 0 (and past it)."""
        after = [(t, lv) for t, lv in self.levels if t >= self.burn_end]
        if not after or after[-1][1] > 0:
            return math.inf
        high = [t for t, lv in after if lv > 0]
        if not high:
            return 0.0
        back = next(t for t, lv in after if t > high[-1])
        return back - self.burn_end


async def run_burn(
    runner: ModelRunner, timings: list[BatchTiming], sessions: int, before: float, burn_s: float,
    after: float, batch_sizes: tuple[int, ...],
) -> BurnRun:
    bucket = runner.buckets[0]
    info = RunnerInfo(runner.buckets, runner.frames_per_chunk, runner.max_steps, batch_sizes)
    opts = SchedulerOptions(degrade=DegradeOptions(), admission=AdmissionOptions(threshold=1e9))
    scheduler = Scheduler(info, CostModel(timings), time.monotonic, opts)
    misses: list[float] = []
    moves: list[tuple[float, str, int, int, tuple[str, ...]]] = []

    def on_event(e: Event) -> None:
        if isinstance(e, DeadlineMiss | FrameSkipped):
            misses.append(time.monotonic())
        elif isinstance(e, DegradationChanged):
            moves.append((time.monotonic(), e.session_id, e.old_level, e.new_level, e.changes))
        elif isinstance(e, ChunkReady) and e.display_time is not None:  # shown at its display time
            asyncio.get_running_loop().call_later(max(0.0, e.display_time - time.monotonic()), shown, e.session_id)

    engine = Engine(scheduler, runner, executor=model_executor(), on_event=on_event)
    ids = [f"burn{i}" for i in range(sessions)]
    delivered: list[float] = []
    counts = dict.fromkeys(ids, 0)
    stop = asyncio.Event()

    def shown(sid: str) -> None:
        if not stop.is_set():
            counts[sid] += 1
            delivered.append(time.monotonic())

    ctx = mp.get_context("spawn")
    started, stop_burn = ctx.Event(), ctx.Event()
    burner = ctx.Process(target=burn, args=(started, stop_burn), daemon=True)
    await engine.start()
    tasks: list[asyncio.Task[None]] = []
    levels: list[tuple[float, int]] = []
    try:
        loop = asyncio.get_running_loop()
        for i, sid in enumerate(ids):
            first = await loop.run_in_executor(None, runner.first_frame, "", i, bucket)
            verdict = engine.add_session(sid, SessionSpec(sid, bucket, seed=i, scene="", observation=first),
                                         fps=24.0, lookahead=1, mode=Mode.PUSH)
            if not verdict.admitted:
                raise RuntimeError(f"{sid} refused: {verdict}")
        tasks = [asyncio.create_task(steer(engine, ids, stop))]
        t_join = time.monotonic()
        while min(counts.values()) == 0 and time.monotonic() - t_join < 30.0:
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        burn_start = burn_end = math.nan
        end = t0 + before + burn_s + after
        while (now := time.monotonic()) < end:
            if math.isnan(burn_start) and now >= t0 + before:
                burner.start()
                await loop.run_in_executor(None, started.wait, 30.0)
                burn_start = time.monotonic()
            elif math.isnan(burn_end) and not math.isnan(burn_start) and now >= burn_start + burn_s:
                stop_burn.set()
                await loop.run_in_executor(None, burner.join, 10.0)
                burn_end = time.monotonic()
                end = burn_end + after
            levels.append((now, max(scheduler.stats(s).level for s in ids)))
            await asyncio.sleep(SAMPLE_S)
        stop.set()
        for sid in ids:
            engine.remove_session(sid)
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        stop_burn.set()
        if burner.is_alive():
            burner.join(10.0)
        await engine.stop()
    return BurnRun(t0, burn_start, burn_end, time.monotonic(), levels, delivered, misses, moves)


def print_report(run: BurnRun, sessions: int) -> None:
    def phase(t: float) -> str:
        return "burn" if run.burn_start <= t < run.burn_end else "calm"

    print(f"{'second':>6} {'phase':>5} {'max level':>9} {'fps/session':>11} {'misses':>6}")
    per_frame: Counter[int] = Counter(int(t - run.t0) for t in run.frames if t >= run.t0)
    per_miss: Counter[int] = Counter(int(t - run.t0) for t in run.misses if t >= run.t0)
    for sec in range(int(run.end - run.t0)):
        lv = max((lv for t, lv in run.levels if sec <= t - run.t0 < sec + 1), default=0)
        print(f"{sec:6d} {phase(run.t0 + sec + 0.5):>5} {lv:9d} {per_frame[sec] / sessions:11.1f} {per_miss[sec]:6d}")
    print("ladder moves (seconds from the burn's start):")
    for t, sid, old, new, changes in run.moves:
        print(f"  {t - run.burn_start:+7.2f} s  {sid} L{old} -> L{new}  {', '.join(changes)}")


async def main_async(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    sizes = tuple(args.batch_sizes)
    runner = ModelRunner.from_pretrained(args.weights, max_sessions=max(16, 2 * args.sessions), dtype=args.dtype,
                                         trace=args.cpu_trace)
    steps = tuple(range(2, runner.max_steps + 1))
    timings = warm_up(runner, runner.buckets[:1], steps, sizes)
    print(f"weights {args.weights}, {args.threads} thread(s), {str(runner.dtype).removeprefix('torch.')}, "
          f"bucket {runner.buckets[0]}, {args.sessions} session(s) at 24 fps; {args.before:g} s calm, "
          f"one core burnt for {args.burn:g} s, {args.after:g} s calm", flush=True)
    run = await run_burn(runner, timings, args.sessions, args.before, args.burn, args.after, sizes)
    print_report(run, args.sessions)
    print(f"ladder_burn max_level={run.max_level} recover_s={run.recover_s:.2f} back_s={run.back_s:.2f} "
          f"burn_s={run.burn_end - run.burn_start:.2f} calm_max_level={run.calm_max_level} moves={len(run.moves)}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="The degradation ladder while another process burns one core.")
    ap.add_argument("--sessions", type=int, default=1)
    ap.add_argument("--before", type=float, default=5.0, help="calm seconds before the burn")
    ap.add_argument("--burn", type=float, default=10.0, help="seconds one core is burnt")
    ap.add_argument("--after", type=float, default=15.0, help="calm seconds after the burn")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="auto", choices=DTYPES, help="the model's float type (the server's --dtype)")
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--cpu-trace", action=argparse.BooleanOptionalAction, default=True,
                    help="chunks as TorchScript traces, as the server runs them by default")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    args = ap.parse_args(argv)
    if args.sessions < 1 or args.burn <= 0 or args.before < 0 or args.after <= 0:
        ap.error("need --sessions >= 1, --burn > 0, --before >= 0 and --after > 0")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
