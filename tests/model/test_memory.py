"""Freed tensor memory stays with the process: a hot path that allocates and frees the
same megabyte-sized buffers every chunk must not page-fault them in again each time."""

import resource
import sys

import pytest
import torch

from worldserve.model.memory import tune_malloc


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_after_tune_malloc_reallocating_a_big_buffer_does_not_fault_it_in_again() -> None:
    assert tune_malloc() is True
    assert tune_malloc() is True  # once per process; later calls change nothing
    pages = (8 << 20) // resource.getpagesize()
    torch.ones(8 << 20, dtype=torch.uint8)  # the heap grows once
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        torch.ones(8 << 20, dtype=torch.uint8)  # 8 MB written, freed
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 2 * pages, f"{faults} page faults for 20 reuses of one {pages}-page buffer"
