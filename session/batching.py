"""Forming a plan's batches: earliest deadline first across compatibility keys, each batch
sized by the cost model so it finishes before every member's target (``Scheduler``)."""

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
    within ``window`` while the batch still meets every member's target."""
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
        items = groups.pop(lead_key)
        bucket, steps = lead_key
        if t + predict(bucket, steps, 1) > lead.target:
            items.remove(lead)  # the batches before it took its time: next plan decides
        else:
            batch, deadline, limit = [lead], lead.target, lead.due + window
            rest = []
            for it in items:
                if it is lead:
                    continue
                if (
                    len(batch) < max_batch
                    and it.due <= limit
                    and t + predict(bucket, steps, len(batch) + 1) <= min(deadline, it.target)
                ):
                    batch.append(it)
                    deadline = min(deadline, it.target)
                else:
                    rest.append(it)
            t += predict(bucket, steps, len(batch))
            out.append(make(lead_key, batch, deadline))
            items = rest
        if items:
            groups[lead_key] = items
    return out
