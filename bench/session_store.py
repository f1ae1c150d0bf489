"""Session store micro-benchmark: ``python -m bench.session_store``.

Times the store operations the server runs per message for 1,000 sessions: attach (a new
session at block 0, token included), lookup (``get``), next block (``open_block``),
commit (``commit_block``) and detach + resume. Prints µs per operation (best and median
of several rounds) and a last line for scripts::

    session_store attach_us=<x> lookup_us=<x> commit_us=<x>

Goal: attach under 20 µs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from worldserve.session.session import SessionConfig
from worldserve.session.store import SessionStore


def _rounds(sessions: int, rounds: int) -> dict[str, list[float]]:
    config = SessionConfig()
    results: dict[str, list[float]] = {}

    def record(name: str, seconds: float, ops: int) -> None:
        results.setdefault(name, []).append(seconds / ops * 1e6)

    for _ in range(rounds):
        store = SessionStore(sessions, 60.0)
        t0 = time.perf_counter()
        decisions = [store.open_block(None, 0, config=config) for _ in range(sessions)]
        record("attach", time.perf_counter() - t0, sessions)

        ids = [d.session_id for d in decisions]
        tokens = {d.session_id: d.token or "" for d in decisions}
        order = ids * 5
        random.shuffle(order)
        t0 = time.perf_counter()
        for sid in order:
            store.get(sid)
        record("lookup", time.perf_counter() - t0, len(order))

        t0 = time.perf_counter()
        for block in range(1, 4):
            for sid in ids:
                store.open_block(sid, block)
        record("next block", time.perf_counter() - t0, 3 * sessions)

        t0 = time.perf_counter()
        for block in range(4):
            for sid in ids:
                store.commit_block(sid, block)
        record("commit", time.perf_counter() - t0, 4 * sessions)

        t0 = time.perf_counter()
        for sid in ids:
            store.detach(sid)
            store.resume(sid, tokens[sid])
        record("detach+resume", time.perf_counter() - t0, sessions)

        t0 = time.perf_counter()
        store.clear()
        record("close", time.perf_counter() - t0, sessions)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    results = _rounds(args.sessions, args.rounds)

    print(f"session store, {args.sessions} sessions, {args.rounds} rounds")
    print(f"{'operation':<15} {'best µs/op':>11} {'median µs/op':>13}")
    for name, values in results.items():
        print(f"{name:<15} {min(values):>11.2f} {statistics.median(values):>13.2f}")
    best = {name: min(values) for name, values in results.items()}
    print(
        f"session_store attach_us={best['attach']:.2f} lookup_us={best['lookup']:.2f} "
        f"commit_us={best['commit']:.2f}"
    )


if __name__ == "__main__":
    main()
