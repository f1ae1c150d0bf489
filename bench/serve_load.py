"""Serving load: the real default model behind the engine, in-process, no network.

    python -m bench.serve_load [--quick] [--seconds S] [--threads N] [--dtype D] [--weights PATH]
                               [--device cpu|cuda] [--cuda-graphs] [--no-cpu-trace] [--batch-sizes 1 2 4 8] [--limit N]

Sessions join one by one at random moments over ``--join-spread`` seconds (as clients do,
not in lockstep); the scheduler starts each new clock in phase with the running ones. A level
is measured from the moment every session has its first frame (``all_first_frames``, from
the first join), for ``--seconds``. As in the server, a session's start frame (~30 ms of CPU
at 64 px) is rendered on a worker thread before it joins, not on the model thread.

Push-mode sessions at the smallest bucket ask for 24 fps at full quality; a consumer task per
session drains its latest-frame holder, as a transport would. Reports:

- sessions_at_24fps: the most sessions held for ``--seconds`` (60 by default) with a
  deadline-miss rate (misses + skipped frames over frames due) below 1%, degradation off
  (the load doubles from one session until it fails or reaches ``--limit``, then bisects);
- the same with cross-session batching off (each session stepped alone): batching_gain;
- overhead at saturation: every session asks for far more frames than the engine can make
  (240 fps); the engine's delivered frames/s is set against what the runner alone reaches on
  the very batches the engine ran (their sizes and step counts, each timed back to back in
  this run): 1 - engine / runner, in rounds (3 with ``--quick``, else 5) that alternate an
  engine run with the runner alone on its batches; the median round counts, so the
  machine's drift between minutes is not charged to the engine. The batch mix is printed; a scheduler that picks small
  deadline-safe batches at saturation shows up in the mix, not as overhead. Its breakdown
  line says whether the overhead is idle model time (model busy) or slower batches
  (engine/alone, against the runner alone at the largest batch size timed just before);
- overload: twice sessions_at_24fps with degradation on: every session's share of its expected
  frames (overload_min_share = the lowest) and the histogram of ladder levels over time.

Each load level's line is followed by where its time went: the batch sizes formed, the
model thread's busy share, the engine's hand-off to it (ms a plan beyond the runner's own
time), the share of batches over 1.25x the cost model's prediction, the engine's batch
times over the runner alone's at the same size, the event loop's lag (p99 of a 10 ms timer)
and the missed frames by cause (``late_start``: the batch was on time but started too late;
``slow_batch``: it took longer than predicted; ``skipped``: display slots that got no frame).
With ``--canvas`` it also says where the canvas's work went (``tile_decode.DecodeCounts``):
fills and decodes done on the decoder's thread (``ahead``), those the model thread still
waited for (``waited``, ms per second of wall time), and the decodes and the fills done inside
chunks (``inline``, ``fills inline``).

- capacity_sessions: the largest N whose batches of N, run back to back by the runner alone,
  make N x 24 frames/s at full quality (the model's physical limit on this machine), timed
  just before and just after the batching-on levels and taken from the mean of the two
  timings (the machine's speed while the levels ran; each side is printed, and where they
  differ the machine changed speed under the levels); held_share = sessions_at_24fps /
  capacity_sessions.

Last line: ``serve_load sessions_at_24fps=<n> capacity_sessions=<n> held_share=<x> miss_rate=<x>
overhead=<x> batching_gain=<x> overload_min_share=<x>``
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from worldserve.bench._steer import steer
from worldserve.model.default.reference.canvas.tile_decode import (
    DECODE_MODES,
    SHARPEN,
    DecodeCounts,
)
from worldserve.model.default.runner import ModelRunner
from worldserve.model.default.weights import DEFAULT_WEIGHTS
from worldserve.model.dtype import DTYPES
from worldserve.server.engine import Engine, model_executor
from worldserve.session.admission import AdmissionOptions
from worldserve.session.costmodel import CostModel
from worldserve.session.degrade import DegradationChanged, DegradeOptions
from worldserve.session.events import ChunkReady, DeadlineMiss, Event, FrameSkipped, SessionStats
from worldserve.session.plan import (
    ACTION_DIM,
    BatchTiming,
    ChunkWork,
    SessionSpec,
    StepOutput,
    StepPlan,
)
from worldserve.session.scheduler import Mode, RunnerInfo, Scheduler, SchedulerOptions
from worldserve.session.warmup import warm_up

BATCH_SIZES = (1, 2, 4, 8)
NEVER = DegradeOptions(high=1e9, low=1e8, miss_threshold=10**9)


@dataclass
class LoadResult:
    sessions: int
    seconds: float
    frames: list[int]  # delivered per session
    expected: float  # frames per session at the requested fps
    miss_rate: float
    levels: Counter[int] = field(default_factory=Counter)
    ladder: list[tuple[str, ...]] = field(default_factory=list)
    batches: Counter[tuple[int, int]] = field(default_factory=Counter)  # (size, steps) -> count
    first_frames: float = 0.0  # seconds from the first join to every session's first frame
    # where the time goes (measured while measuring):
    busy: float = 0.0  # share of the wall time the model thread spent in plans
    handoff_ms: float = 0.0  # mean per plan: the engine's wait for the model thread beyond the runner's own time
    slow_share: float = 0.0  # batches that took over 1.25x the cost model's prediction
    tax: float = float("nan")  # mean in-engine batch time over the runner alone's at that size
    loop_lag_ms: float = 0.0  # p99 of the event loop's lateness waking a 10 ms timer
    causes: Counter[str] = field(default_factory=Counter)  # missed frames by cause
    canvas: DecodeCounts | None = None  # where the canvas's fills and decodes were done (--canvas)

    @property
    def delivered_fps(self) -> float:
        return sum(self.frames) / self.seconds

    @property
    def min_share(self) -> float:
        return min(self.frames) / self.expected if self.frames else 0.0


async def run_load(
    runner: ModelRunner, timings: list[BatchTiming], sessions: int, seconds: float, *,
    fps: float = 24.0, batching: bool = True, degrade: bool = False, join_spread: float = 0.0,
    batch_sizes: tuple[int, ...] = BATCH_SIZES, alone: dict[int, float] | None = None,
) -> LoadResult:
    bucket = runner.buckets[0]
    info = RunnerInfo(runner.buckets, runner.frames_per_chunk, runner.max_steps, batch_sizes)
    opts = SchedulerOptions(
        batching=batching, degrade=DegradeOptions() if degrade else NEVER,
        admission=AdmissionOptions(threshold=1e9),  # the bench decides the load
    )
    scheduler = Scheduler(info, CostModel(timings), time.monotonic, opts)
    changes: list[DegradationChanged] = []
    batches: Counter[tuple[int, int]] = Counter()
    measuring = False
    w = _Where()

    def on_step(plan: StepPlan, out: StepOutput, seconds: float) -> None:
        if measuring:
            w.step(plan, out, seconds, scheduler.cost, alone)
            for b in plan.batches:
                batches[(len(b.items), b.steps)] += 1

    def on_event(e: Event) -> None:
        if isinstance(e, DegradationChanged):
            changes.append(e)
        elif isinstance(e, ChunkReady) and e.display_time is not None:  # shown at its display time
            asyncio.get_running_loop().call_later(max(0.0, e.display_time - time.monotonic()), shown, e.session_id)
        if measuring:
            w.event(e)

    engine = Engine(  # a fresh model thread per run; stop() shuts it down
        scheduler, runner, executor=model_executor(), batching=batching,
        on_event=on_event, on_step=on_step,
    )
    ids = [f"load{i}" for i in range(sessions)]
    counts = dict.fromkeys(ids, 0)
    levels: Counter[int] = Counter()
    stop = asyncio.Event()

    def shown(sid: str) -> None:
        if not stop.is_set():
            counts[sid] += 1

    def count_levels() -> None:
        for sid in ids:
            levels[scheduler.stats(sid).level] += 1

    await engine.start()
    joins = np.sort(np.random.default_rng(sessions).uniform(0.0, join_spread, sessions))
    try:
        t_start = time.monotonic()
        for i, sid in enumerate(ids):
            await asyncio.sleep(max(0.0, t_start + joins[i] - time.monotonic()))
            # as the server does: the start frame is rendered off the model thread
            first = await asyncio.get_running_loop().run_in_executor(None, runner.first_frame, "", i, bucket)
            verdict = engine.add_session(sid, SessionSpec(sid, bucket, seed=i, scene="", observation=first), fps=fps,
                                         lookahead=1, mode=Mode.PUSH)
            if not verdict.admitted:
                raise RuntimeError(f"{sid} refused: {verdict}")
        tasks = [asyncio.create_task(steer(engine, ids, stop, count_levels)), asyncio.create_task(w.tick(stop))]
        # measure from the moment every session has its first frame: opening a session
        # (rendering its start frame, filling its cache) is not the steady load
        t_joined = time.monotonic()
        while min(counts.values()) == 0 and time.monotonic() - t_joined < max(30.0, seconds):
            await asyncio.sleep(0.01)
        first_frames = time.monotonic() - t_start
        before = [scheduler.stats(s) for s in ids]
        start_counts = dict(counts)
        decoder = runner.ground.decoder if runner.ground is not None else None
        canvas_before = decoder.counts.copy() if decoder is not None else None
        t0 = time.monotonic()
        measuring = True
        await asyncio.sleep(seconds)
        measuring = False
        elapsed = time.monotonic() - t0
        canvas = decoder.counts.since(canvas_before) if decoder is not None and canvas_before else None
        stop.set()
        stats = [scheduler.stats(s) for s in ids]
        due = frames_due(stats) - frames_due(before)
        missed = frames_missed(stats) - frames_missed(before)
        frames = [counts[s] - start_counts[s] for s in ids]
        for sid in ids:
            engine.remove_session(sid)
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await engine.stop()
    return LoadResult(sessions, elapsed, frames, elapsed * fps, missed / max(due, 1), levels,
                      [c.changes for c in changes], batches, first_frames, *w.summary(elapsed), canvas=canvas)


class _Where:
    """Where a load level's time goes: the model thread's busy share, the hand-off to it,
    batches slower than predicted, the engine's batch times against the runner alone's, the
    event loop's lag, and each missed frame by cause."""

    def __init__(self) -> None:
        self.busy = self.handoff = 0.0
        self.plans = self.batches = self.slow = 0
        self.ratios: list[float] = []
        self.lags: list[float] = []
        self.causes: Counter[str] = Counter()
        self.slow_sids: set[str] = set()

    def step(self, plan: StepPlan, out: StepOutput, seconds: float, cost: CostModel,
             alone: dict[int, float] | None) -> None:
        self.plans += 1
        self.busy += seconds
        self.handoff += max(0.0, seconds - sum(t.seconds for t in out.timings))
        self.slow_sids = set()
        for batch, t in zip(plan.batches, out.timings, strict=False):
            self.batches += 1
            if t.seconds > 1.25 * cost.predict(t.bucket, t.steps, t.size):
                self.slow += 1
                self.slow_sids.update(w.session_id for w in batch.items)
            if alone and t.size in alone and t.steps == 4:
                self.ratios.append(t.seconds / alone[t.size])

    def event(self, e: Event) -> None:
        if isinstance(e, DeadlineMiss):  # the plan's own events follow its on_step
            self.causes["slow_batch" if e.session_id in self.slow_sids else "late_start"] += 1
        elif isinstance(e, FrameSkipped):
            self.causes["skipped"] += e.frames

    async def tick(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            t = time.monotonic()
            await asyncio.sleep(0.01)
            self.lags.append(time.monotonic() - t - 0.01)

    def summary(self, elapsed: float) -> tuple[float, float, float, float, float, Counter[str]]:
        lag = float(np.percentile(self.lags, 99)) * 1e3 if self.lags else 0.0
        tax = float(np.mean(self.ratios)) if self.ratios else float("nan")
        return (self.busy / elapsed, 1e3 * self.handoff / max(self.plans, 1),
                self.slow / max(self.batches, 1), tax, lag, self.causes)


def where_line(res: LoadResult) -> str:
    """A level's breakdown: batch sizes formed, model thread busy, hand-off, slow batches,
    engine/alone batch time, loop lag p99, missed frames by cause."""
    sizes: Counter[int] = Counter()
    for (size, _), n in res.batches.items():
        sizes[size] += n
    mix = " ".join(f"{k}:{v}" for k, v in sorted(sizes.items())) or "-"
    causes = " ".join(f"{k}={v}" for k, v in sorted(res.causes.items())) or "none"
    line = (f"batches {mix} | model busy {res.busy:.2f} handoff {res.handoff_ms:.2f} ms "
            f"slow {res.slow_share:.2f} engine/alone {res.tax:.2f} | loop lag p99 "
            f"{res.loop_lag_ms:.1f} ms | misses {causes}")
    if res.canvas is not None:  # canvas work: on its thread, waited for there, or done inside the chunks
        line += f" | canvas {res.canvas.line(res.seconds)}"
    return line


def alone_by_size(runner: ModelRunner, limit: int, period: float, seconds: float) -> dict[int, float]:
    """Seconds per chunk of the runner alone at full steps, batch sizes 1 .. the first whose
    chunk takes over a frame period (or ``limit``)."""
    out: dict[int, float] = {}
    for n in range(1, limit + 1):
        out[n] = runner_alone_seconds(runner, n, runner.max_steps, seconds)
        if out[n] > period:
            break
    return out


def capacity_sessions(alone: dict[int, float], period: float) -> int:
    """The largest N whose batches of N, back to back, make N frames a period: the model's
    physical limit at full quality on this machine."""
    return max((n for n, t in alone.items() if t <= period), default=0)


def during(before: dict[int, float], after: dict[int, float]) -> dict[int, float]:
    """The runner alone's chunk times while the load levels ran, estimated as the mean of
    the timings taken just before and just after them, for the sizes timed on both sides
    (each side stops at its first size over a frame period). The machine drifts by +-20 %
    within minutes: the levels' own capacity is nearer the mean than either side."""
    return {n: (before[n] + after[n]) / 2 for n in sorted(before.keys() & after.keys())}


def overhead_rounds(engine_fps: list[float], alone_fps: list[float]) -> float:
    """The engine's overhead at saturation from rounds that alternate an engine run with the
    runner alone on that run's own batches: the median over rounds of 1 - engine / alone, so
    a drift of the machine between rounds (or one round on a slow minute) does not count."""
    return float(np.median([1 - e / a for e, a in zip(engine_fps, alone_fps, strict=True)]))


def frames_due(stats: list[SessionStats]) -> int:
    return sum(s.frames_due for s in stats)


def frames_missed(stats: list[SessionStats]) -> int:
    return sum(s.frames_skipped + s.deadline_misses for s in stats)


def runner_alone_seconds(runner: ModelRunner, batch: int, steps: int, seconds: float) -> float:
    """Seconds per chunk the runner takes stepping ``batch`` sessions at ``steps`` denoising
    steps back to back, no engine, in the steady state the engine serves (caches full: a
    session's first chunks run eagerly, as its cache fills, and are not timed)."""
    bucket = runner.buckets[0]
    ids = [f"alone{i}" for i in range(batch)]
    runner.execute(StepPlan(new_sessions=[SessionSpec(s, bucket, seed=i, scene="") for i, s in enumerate(ids)]))
    a = np.zeros((runner.frames_per_chunk, ACTION_DIM), np.float32)
    a[:, 0] = 1.0  # a key held: the camera moves, so a world canvas fills and decodes as it serves
    items = [ChunkWork(s, 0, a) for s in ids]
    with torch.inference_mode():
        for _ in range(runner.cfg.cache_frames // runner.frames_per_chunk + 2):
            runner._run_chunk(bucket, steps, items)
        n, t0 = 0, time.perf_counter()
        while n < 3 or time.perf_counter() - t0 < seconds:
            runner._run_chunk(bucket, steps, items)
            n += 1
        per_chunk = (time.perf_counter() - t0) / n
    runner.execute(StepPlan(freed=ids))
    return per_chunk


def runner_fps_on_mix(runner: ModelRunner, mix: Counter[tuple[int, int]], seconds: float) -> float:
    """Frames/s the runner alone reaches on exactly the batches in ``mix`` ((size, steps) ->
    count): their frames over the sum of their back-to-back chunk times."""
    total = sum(mix.values())
    frames = busy = 0.0
    for (size, steps), count in mix.items():
        per = runner_alone_seconds(runner, size, steps, max(0.5, seconds * count / total))
        frames += count * size * runner.frames_per_chunk
        busy += count * per
    return frames / busy if busy else float("nan")


async def largest_held(holds: Callable[[int], Awaitable[bool]], limit: int) -> int:
    """The largest n in 1..``limit`` for which ``holds(n)``, assuming that a load which holds
    also holds with fewer sessions: doubling from 1, then bisecting; 0 if one session fails."""
    good, bad, n = 0, limit + 1, 1
    while good < limit:
        if not await holds(n):
            bad = n
            break
        good, n = n, min(2 * n, limit)
    while bad - good > 1:
        mid = (good + bad) // 2
        if await holds(mid):
            good = mid
        else:
            bad = mid
    return good


async def capacity(
    runner: ModelRunner, timings: list[BatchTiming], seconds: float, batching: bool, limit: int,
    join_spread: float, batch_sizes: tuple[int, ...] = BATCH_SIZES,
    alone: dict[int, float] | None = None,
) -> tuple[int, float, list[LoadResult]]:
    """The most sessions held at 24 fps with < 1% misses: the load doubles from one session
    until a level fails (or ``limit`` holds), then bisects between the last level held and
    the first that failed (``largest_held``)."""
    held: dict[int, float] = {}  # sessions -> miss rate of the levels that held
    results: list[LoadResult] = []

    async def holds(n: int) -> bool:
        res = await run_load(runner, timings, n, seconds, batching=batching, join_spread=join_spread,
                             batch_sizes=batch_sizes, alone=alone)
        results.append(res)
        print(f"  batching={'on ' if batching else 'off'} sessions={n:3d} delivered={res.delivered_fps:7.1f} fps "
              f"miss_rate={res.miss_rate:.3f} min_share={res.min_share:.2f} "
              f"all_first_frames={res.first_frames:.2f}s", flush=True)
        print(f"      {where_line(res)}", flush=True)
        if res.miss_rate < 0.01:
            held[n] = res.miss_rate
            return True
        return False

    good = await largest_held(holds, limit)
    return good, held.get(good, float("nan")), results


async def main_async(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    sizes = tuple(args.batch_sizes)
    runner = ModelRunner.from_pretrained(args.weights, max_sessions=max(64, 2 * args.limit + 2),
                                         dtype=args.dtype, device=args.device, graphs=args.cuda_graphs,
                                         trace=args.cpu_trace, canvas=args.canvas, canvas_decode=args.canvas_decode,
                                         canvas_sharpen=args.canvas_sharpen, canvas_live=args.canvas and args.live)
    steps = tuple(range(2, runner.max_steps + 1))
    timings = warm_up(runner, runner.buckets[:1], steps, sizes)  # the bench may block
    seconds = args.seconds
    spread = args.join_spread
    where = (f"{torch.cuda.get_device_name(runner.device)}{', CUDA graphs' if args.cuda_graphs else ''}"
             if runner.device.type == "cuda"
             else f"{args.threads} thread(s), {'traced' if args.cpu_trace else 'eager'} chunks")
    canvas = ""
    if runner.ground is not None:
        when = "beside" if runner.ground.decoder.beside_chunks else "between"
        canvas = f" with the world canvas (tiles decode {when} chunks)"
    print(f"weights {args.weights}{canvas}, {where}, {str(runner.dtype).removeprefix('torch.')}, "
          f"bucket {runner.buckets[0]}, {runner.max_steps} steps, {seconds:.0f} s per load level, "
          f"sessions join over {spread:g} s")
    period = runner.frames_per_chunk / 24.0
    alone = alone_by_size(runner, args.limit, period, min(seconds, 2.0))
    print("  runner alone, ms a chunk by batch size: "
          + " ".join(f"{n}:{1e3 * t:.1f}" for n, t in alone.items())
          + f" (frame period {1e3 * period:.1f} ms) -> capacity {capacity_sessions(alone, period)} sessions")
    n_on, miss_on, _ = await capacity(runner, timings, seconds, True, args.limit, spread, sizes, alone)
    # the machine drifts (runs of one command move by +-20 %): the same timing after the levels
    # says whether they ran on the machine the capacity was measured on
    later = alone_by_size(runner, args.limit, period, min(seconds, 2.0))
    mean = during(alone, later)
    cap = capacity_sessions(mean, period)
    print("  runner alone after those levels, ms a chunk by batch size: "
          + " ".join(f"{n}:{1e3 * t:.1f}" for n, t in later.items())
          + f" -> capacity {capacity_sessions(later, period)} sessions; mean of both sides "
          + " ".join(f"{n}:{1e3 * t:.1f}" for n, t in mean.items())
          + f" -> capacity {cap} sessions while the levels ran")
    n_off, _, _ = await capacity(runner, timings, seconds, False, args.limit, spread, sizes, alone)
    sat = max(sizes[-1], n_on + 1)
    full = {sizes[-1]: runner_alone_seconds(runner, sizes[-1], runner.max_steps, min(seconds, 2.0))}
    rounds = 3 if args.quick else 5
    engine_fps: list[float] = []
    alone_fps: list[float] = []
    for r in range(rounds):  # engine, runner alone on its batches, engine, ...: drift cancels
        res = await run_load(runner, timings, sat, min(seconds, 20) / 2, fps=240.0, batch_sizes=sizes, alone=full)
        engine_fps.append(res.delivered_fps)
        alone_fps.append(runner_fps_on_mix(runner, res.batches, min(seconds, 10) / 2))
        mix = " ".join(f"{size}x{steps}steps:{n}" for (size, steps), n in sorted(res.batches.items()))
        print(f"  saturation round {r + 1}/{rounds}: {sat} sessions, engine {engine_fps[-1]:.1f} frames/s, "
              f"runner alone on the same batches {alone_fps[-1]:.1f} frames/s "
              f"(overhead {1 - engine_fps[-1] / alone_fps[-1]:.3f}); batches (size x steps: count) {mix}")
        print(f"      {where_line(res)}")
    overhead = overhead_rounds(engine_fps, alone_fps)
    over = await run_load(runner, timings, max(2, 2 * n_on), seconds, degrade=True, join_spread=spread,
                          batch_sizes=sizes)
    hist = " ".join(f"L{k}:{v}" for k, v in sorted(over.levels.items()))
    firsts: list[str] = []
    for ch in over.ladder:
        for c in ch:
            knob = c.split()[0]
            if knob not in firsts:
                firsts.append(knob)
    print(f"  overload: {over.sessions} sessions, min share {over.min_share:.2f}, levels {hist}, "
          f"ladder order seen: {' -> '.join(firsts) or 'none'}")
    gain = n_on / n_off if n_off else float("inf")
    held_share = n_on / cap if cap else float("nan")
    print(f"serve_load sessions_at_24fps={n_on} capacity_sessions={cap} held_share={held_share:.2f} "
          f"miss_rate={miss_on:.4f} overhead={overhead:.3f} "
          f"batching_gain={gain:.2f} overload_min_share={over.min_share:.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Serving load on the real default model, in-process.")
    ap.add_argument("--quick", action="store_true", help="10 s per load level instead of 60")
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--limit", type=int, default=12, help="most sessions to try")
    ap.add_argument("--dtype", default="auto", choices=DTYPES,
                    help="the model's float type (the server's --dtype, auto by default)")
    ap.add_argument("--join-spread", type=float, default=1.0,
                    help="seconds over which the sessions of a load level join, at random moments")
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    ap.add_argument("--cuda-graphs", action="store_true", help="replay steady-state chunks as CUDA graphs")
    ap.add_argument("--cpu-trace", action=argparse.BooleanOptionalAction, default=True,
                    help="on the CPU, chunks as TorchScript traces, as the server runs them by default")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES),
                    help="batch sizes the scheduler forms (the server's --batch-sizes)")
    ap.add_argument("--canvas", action="store_true",
                    help="the default model with its world canvas (the server's --canvas)")
    ap.add_argument("--live", action="store_true",
                    help="with --canvas, the live state of what moves (the server's --canvas-live)")
    ap.add_argument("--canvas-decode", default="auto", choices=DECODE_MODES,
                    help="where the canvas's tiles decode ahead (the server's --canvas-decode)")
    ap.add_argument("--canvas-sharpen", type=float, default=SHARPEN,
                    help="the unsharp mask on the canvas's decoded tiles (the server's --canvas-sharpen; 0: none)")
    args = ap.parse_args(argv)
    if args.cuda_graphs and not args.device.startswith("cuda"):
        ap.error("--cuda-graphs needs --device cuda")
    if args.seconds is None:
        args.seconds = 10.0 if args.quick else 60.0
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
