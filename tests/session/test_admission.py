"""Admission control: full, degraded or refused, from the cost model and the current load."""

from __future__ import annotations

from worldserve.session.admission import Admission, AdmissionOptions, Verdict
from worldserve.session.clock import ManualClock
from worldserve.session.costmodel import CostModel
from worldserve.session.degrade import DegradeOptions
from worldserve.session.fake_runner import FakeRunner, LinearCost
from worldserve.session.plan import SessionSpec
from worldserve.session.scheduler import RunnerInfo, Scheduler, SchedulerOptions

SIZES = (1, 2, 4, 8)


def scheduler(cost: LinearCost) -> Scheduler:
    runner = FakeRunner(cost=cost)
    options = SchedulerOptions(
        admission=AdmissionOptions(threshold=0.85, retry_after=7.0),
        degrade=DegradeOptions(high=1e9, low=1e8),
    )
    return Scheduler(
        RunnerInfo.of(runner, SIZES), CostModel(runner.warmup(SIZES)), ManualClock(), options
    )


def admit(sched: Scheduler, sid: str) -> Admission:
    spec = SessionSpec(sid, 128, 0, "")
    return sched.add_session(sid, spec, fps=24.0, lookahead=1, now=0.0)


def test_sessions_are_admitted_full_then_degraded_then_refused_with_retry_after() -> None:
    sched = scheduler(LinearCost({64: (0.001, 0.0005), 128: (0.008, 0.004)}))
    verdicts = []
    for i in range(40):
        v = admit(sched, f"s{i}")
        verdicts.append(v.verdict)
        if not v.admitted:
            assert v.retry_after == 7.0 and v.settings is None
            break
    order = [Verdict.FULL, Verdict.DEGRADED, Verdict.REFUSED]
    assert verdicts == sorted(verdicts, key=order.index)
    assert set(verdicts) == set(order)
    assert sched.utilisation() <= 0.85


def test_a_degraded_admission_names_the_rung_it_runs_at() -> None:
    sched = scheduler(LinearCost({64: (0.001, 0.0005), 128: (0.008, 0.004)}))
    while (v := admit(sched, f"s{len(sched)}")).verdict is Verdict.FULL:
        pass
    assert v.verdict is Verdict.DEGRADED and v.level > 1 and v.settings is not None
    stats = sched.stats(f"s{len(sched) - 1}", 0.0)
    assert (stats.level, stats.settings) == (v.level, v.settings)
    assert stats.settings.lookahead == 0  # lookahead goes first


def test_refusal_never_evicts_or_degrades_a_running_session() -> None:
    sched = scheduler(LinearCost({64: (0.001, 0.0005), 128: (0.008, 0.004)}))
    while admit(sched, f"s{len(sched)}").admitted:
        pass
    before = {sid: sched.stats(sid, 0.0) for sid in (f"s{i}" for i in range(len(sched)))}
    for i in range(5):
        assert not admit(sched, f"late{i}").admitted
    assert {sid: sched.stats(sid, 0.0) for sid in before} == before
    assert all(f"late{i}" not in sched for i in range(5))
    sched.remove_session("s0")  # room again
    assert admit(sched, "again").admitted


def test_a_session_that_alone_cannot_keep_up_at_any_rung_is_refused() -> None:
    sched = scheduler(LinearCost({64: (0.2, 0.0), 128: (0.4, 0.0)}))  # 200 ms per chunk
    v = admit(sched, "s")
    assert v.verdict is Verdict.REFUSED and v.utilisation > 0.85
    assert len(sched) == 0
