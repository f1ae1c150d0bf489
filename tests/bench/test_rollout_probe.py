"""worldserve.bench.rollout_probe: the known region follows the camera, the median leaves the ground and
removes the flakes, and a short probe of the default weights prints its lines and writes the
strip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from worldserve.bench.rollout_probe import known_mask, main, median3


def test_known_region_follows_the_summed_shift() -> None:
    still = known_mask(np.zeros(2), 16)
    assert still[1:-1, 1:-1].all() and not still[0].any() and not still[:, -1].any()
    moved = known_mask(np.array([0.0, 5.0]), 16)  # the ground moved 5 px right
    assert not moved[:, :6].any() and moved[1:-1, 6:].all()
    assert not known_mask(np.array([16.0, 0.0]), 16).any()


def test_median_removes_a_flake_and_keeps_edges() -> None:
    frame = np.zeros((8, 8, 3), np.uint8)
    frame[:, 4:] = 200  # an edge between two grounds
    flaked = frame.copy()
    flaked[2, 1] = 255  # a flake on the dark side
    out = median3(flaked)
    assert out[2, 1].tolist() == [0, 0, 0]
    np.testing.assert_array_equal(out, median3(frame))
    np.testing.assert_array_equal(out[:, 3], 0)
    np.testing.assert_array_equal(out[:, 4], 200)


def test_a_short_probe_prints_and_writes_the_strip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "probe.png"
    main(["--length", "12", "--snaps", "3", "8", "--window", "5", "--threads", "1", "--out", str(out)])
    text = capsys.readouterr().out
    assert "tropical moderate day snowfall spring" in text  # seed 11's episode 1
    contrast = next(line for line in text.splitlines() if "contrast, model" in line)
    assert len(contrast.split()[2:]) == 3  # 11 frames in windows of 5
    assert "3: " in text and "8: " in text  # the first frame's ground is still in view
    strip = np.asarray(Image.open(out))
    assert strip.shape == (128, 128, 3)
