"""Forming a plan's batches: earliest deadline first across compatibility keys, each batch
sized by the cost model so it finishes before every member's target (``Scheduler``).

Chunks of one bucket at different step counts (the ladder's middle: some sessions already
cut to fewer steps) would split into a batch per step count, and a second batch pays the
model's fixed cost per forward again. Where the cost model says it costs less, the chunks at
fewer steps run in the batch at more steps instead: the same frames' work, with the steps
they gave up given back, in less model time than their own batch. ``bench.stream_batch``
measured this against the alternatives: one forward carrying each chunk at its own step
(stream batching) took 6-17 % less time than the split batches where this took 14-31 %
less, and it ran eagerly, where a batch at one step count runs as a recorded trace.
``Load`` (``session/costmodel.py``) predicts with the same rule (``cheaper_together``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from worldserve.session.plan import Batch

Key = tuple[int, int]  # (bucket, steps): chunks with equal keys can share a batch
R = TypeVar("R")
Predict = Callable[[int, int, int], float]  # (bucket, steps, batch size) -> seconds


@dataclass(slots=True)
class Item(Generic[R]):
    due: float  # EDF key
    target: float  # what a batch holding it must finish by
    eligible: bool  # may lead a batch now (else it may only join one)
    rec: R


def form_batches(
    groups: dict[Key, list[Item[R]]],
    now: float,
    *,
    predict: Predict,
    max_batch: int,
    window: float,
    rank: Callable[[Item[R]], tuple[float, int, int, int]],
    make: Callable[[Key, list[Item[R]], float], Batch],
) -> list[Batch]:
    """The batches of one plan, in the order they run. ``rank`` orders items (deadline
    first); ``make`` turns chosen items into a ``Batch``. A lead joins others of its key due
    within ``window`` while the batch still meets every member's target, then those of its
    bucket at fewer steps where that costs less than their own batch (``cheaper_together``);
    a lead whose bucket has chunks at more steps due with it starts that batch instead where
    it would join it (``_lead_up``)."""
    out: list[Batch] = []
    for items in groups.values():
        items.sort(key=rank)
    t = now  # when the next batch of this plan would start
    while groups:
        lead_key, lead = None, None
        for key, items in groups.items():
            first = next((it for it in items if it.eligible), None)
            if first is not None and (lead is None or rank(first) < rank(lead)):
                lead_key, lead = key, first
        if lead_key is None or lead is None:
            return out
        lead_key, lead = _lead_up(groups, lead_key, lead, predict, window, max_batch, t)
        items = groups.pop(lead_key)
        bucket, steps = lead_key
        if t + predict(bucket, steps, 1) > lead.target:
            items.remove(lead)  # the batches before it took its time: next plan decides
        else:
            batch: list[Item[R]] = [lead]
            limit = lead.due + window
            items = _join(batch, items, predict, lead_key, t, limit, max_batch)
            for low in sorted((k for k in groups if k[0] == bucket and k[1] < steps), key=lambda k: -k[1]):
                due = _due_by(groups[low], limit)
                if due and cheaper_together(predict, bucket, steps, len(batch), low[1], due):
                    left = _join(batch, groups.pop(low), predict, lead_key, t, limit, max_batch)
                    if left:
                        groups[low] = left
            deadline = min(it.target for it in batch)
            batch.sort(key=rank)
            t += predict(bucket, steps, len(batch))
            out.append(make(lead_key, batch, deadline))
        if items:
            groups[lead_key] = items
    return out


def _join(
    batch: list[Item[R]], candidates: list[Item[R]], predict: Predict, key: Key, start: float, limit: float,
    max_batch: int,
) -> list[Item[R]]:
    """Add to ``batch`` (of ``key``, starting at ``start``) the candidates due by ``limit``, in
    rank order, while it still finishes before every member's target; return the others."""
    bucket, steps = key
    deadline = min(it.target for it in batch)
    rest = []
    for it in candidates:
        if it is batch[0]:  # the lead, in its own key's candidates
            continue
        if (
            len(batch) < max_batch
            and it.due <= limit
            and start + predict(bucket, steps, len(batch) + 1) <= min(deadline, it.target)
        ):
            batch.append(it)
            deadline = min(deadline, it.target)
        else:
            rest.append(it)
    return rest


def _due_by(items: list[Item[R]], limit: float) -> int:
    """How many of ``items`` are due by ``limit`` (may join a batch whose window ends there)."""
    return sum(it.due <= limit for it in items)


def cheaper_together(predict: Predict, bucket: int, steps: int, size: int, low: int, n: int) -> bool:
    """Whether ``n`` chunks at ``low`` steps cost less model time in a batch of ``size``
    chunks at ``steps`` steps than in a batch of their own (``predict``: the seconds of a
    batch, or of a group run as batches)."""
    return predict(bucket, steps, size + n) - predict(bucket, steps, size) < predict(bucket, low, n)


def _lead_up(
    groups: dict[Key, list[Item[R]]], key: Key, lead: Item[R], predict: Predict, window: float,
    max_batch: int, start: float,
) -> tuple[Key, Item[R]]:
    """The batch a lead should start: its own, or, where chunks of its bucket at more steps
    are due with it and would take it and its key's chunks in for less than their own batch
    costs, and where that batch (starting at ``start``) would still make the lead's target,
    the batch at the most steps, led by that key's first eligible chunk; the lead then joins
    it."""
    bucket, steps = key
    limit = lead.due + window
    higher = sorted((k for k in groups if k[0] == bucket and k[1] > steps), key=lambda k: -k[1])
    for hk in higher:
        first = next((it for it in groups[hk] if it.eligible and it.due <= limit), None)
        if first is None:
            continue
        size = min(_due_by(groups[hk], limit), max_batch)
        n = min(_due_by(groups[key], limit), max_batch - size)
        if (
            n > 0
            and cheaper_together(predict, bucket, hk[1], size, steps, n)
            and start + predict(bucket, hk[1], size + n) <= min(lead.target, first.target)
        ):
            return hk, first
    return key, lead
