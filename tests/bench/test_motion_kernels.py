"""bench.motion_kernels reads the warp's kernels off the default model and restores the warp."""

from __future__ import annotations

import re

import pytest

import model.dit as dit
from bench import motion_kernels


def test_prints_the_mass_on_the_commanded_shift(capsys: pytest.CaptureFixture[str]) -> None:
    real = dit.shift_warp
    motion_kernels.main(["--frames", "2"])
    assert dit.shift_warp is real
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 + len(motion_kernels.ACTIONS) + 1
    m = re.fullmatch(r"motion_kernels mean_mass=([\d.]+) min_mass=([\d.]+)", out[-1])
    assert m is not None
    mean, low = float(m[1]), float(m[2])
    assert 0.0 < low <= mean <= 1.0
    idle = out[1].split()
    assert idle[0] == "idle" and float(idle[2]) > 0.5  # a still camera keeps the frame where it is
