"""worldserve.bench.motion_kernels on the committed weights: each action's kernel peaks at the shift the
camera commands, and the summary line reports the mass there."""

from __future__ import annotations

import re

import numpy as np
import pytest

from worldserve.bench import motion_kernels


def test_each_kernel_peaks_at_the_commanded_shift(capsys: pytest.CaptureFixture[str]) -> None:
    motion_kernels.main(["--frames", "2"])
    out = capsys.readouterr().out.strip().splitlines()
    radius = int(re.search(r"offsets -(\d+)\.\.", out[0])[1])  # type: ignore[index]
    rows = out[1:-1]
    assert [r.split()[0] for r in rows] == [name.split()[0] for name in motion_kernels.ACTIONS]
    masses = []
    for row in rows:
        m = re.search(r"([+-]\d+),([+-]\d+)\s+([\d.]+)\s+([\d.]+)\s+\[([^\]]*)\]", row)
        assert m is not None, row
        dx, mass_y, mass_x = int(m[2]), float(m[3]), float(m[4])
        kx = np.array(m[5].split(), dtype=float)
        assert len(kx) == 2 * radius + 1
        # a scene moving by dx pixels is copied from offset -dx: the kernel's peak, where
        # the reported mass is read
        assert int(np.argmax(kx)) == radius - dx, row
        assert mass_x == pytest.approx(kx.max(), abs=1e-3)
        masses += [mass_y, mass_x]
    s = re.fullmatch(r"motion_kernels mean_mass=([\d.]+) min_mass=([\d.]+)", out[-1])
    assert s is not None
    assert float(s[1]) == pytest.approx(np.mean(masses), abs=2e-3)
    assert float(s[2]) == pytest.approx(min(masses), abs=1e-3) and float(s[2]) > 0.5
