"""Scheduler overhead per engine step: ``schedule()`` + ``update()`` with the fake runner.

Runs N push sessions (24 fps, random phases, lookahead 0-2, two buckets, two priorities)
for a few simulated seconds on a manual clock; the fake runner "spends" its predicted
time on that clock, so only the scheduler's own Python time is measured. A step is one
non-empty plan; the idle ``schedule``/``next_wakeup``/``take_events`` calls between steps
are counted in its cost too.

    python -m bench.scheduler [--seconds 5]
"""

from __future__ import annotations

import argparse
import random
import time

from worldserve.session.admission import AdmissionOptions
from worldserve.session.clock import ManualClock
from worldserve.session.costmodel import CostModel
from worldserve.session.fake_runner import FakeRunner, LinearCost
from worldserve.session.plan import SessionSpec
from worldserve.session.scheduler import RunnerInfo, Scheduler, SchedulerOptions

SIZES = (1, 2, 4, 8, 16)


def run(sessions: int, seconds: float, seed: int = 0) -> dict[str, float]:
    rnd = random.Random(seed)
    clock = ManualClock(1000.0)
    # cheap enough that 64 sessions fit: the point is the scheduler, not degradation
    cost = LinearCost({64: (0.0005, 0.0001), 128: (0.001, 0.0002)})
    runner = FakeRunner(cost=cost, sleep=clock.advance, frame_side=4)
    options = SchedulerOptions(admission=AdmissionOptions(threshold=10.0))
    sched = Scheduler(RunnerInfo.of(runner, SIZES), CostModel(runner.warmup(SIZES)), clock, options)
    for i in range(sessions):
        sid = f"s{i}"
        spec = SessionSpec(sid, rnd.choice((64, 128)), i, "bench")
        verdict = sched.add_session(
            sid, spec, fps=24.0, lookahead=rnd.randint(0, 2), priority=i % 2, now=clock()
        )
        assert verdict.admitted, verdict
        clock.advance(rnd.uniform(0.0, 0.005))
    steps = chunks = batches = 0
    spent = 0.0
    end = clock() + seconds
    while clock() < end:
        now = clock()
        t0 = time.perf_counter()
        plan = sched.schedule(now)
        if plan.is_empty():
            sched.take_events()
            wake = sched.next_wakeup(now)
            spent += time.perf_counter() - t0
            clock.set(wake)
            continue
        spent += time.perf_counter() - t0
        out = runner.execute(plan)
        t1 = time.perf_counter()
        sched.update(plan, out, clock())
        spent += time.perf_counter() - t1
        steps += 1
        batches += len(plan.batches)
        chunks += sum(len(b.items) for b in plan.batches)
    return {
        "steps": steps,
        "chunks_per_step": chunks / steps,
        "batches_per_step": batches / steps,
        "us_per_step": spent / steps * 1e6,
        "us_per_chunk": spent / chunks * 1e6,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="simulated seconds per run")
    args = parser.parse_args(argv)
    print(
        f"{'sessions':>8} {'steps':>6} {'chunks/step':>11} {'batches/step':>12} "
        f"{'us/step':>8} {'us/chunk':>8}"
    )
    last = {}
    for n in (8, 16, 32, 64):
        last = run(n, args.seconds)
        print(
            f"{n:>8} {last['steps']:>6.0f} {last['chunks_per_step']:>11.2f} "
            f"{last['batches_per_step']:>12.2f} {last['us_per_step']:>8.1f} "
            f"{last['us_per_chunk']:>8.1f}"
        )
    print(f"scheduler sessions=64 us_per_step={last['us_per_step']:.1f}")


if __name__ == "__main__":
    main()
