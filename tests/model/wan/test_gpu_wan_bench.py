"""bench.gpu_wan runs its whole loop at a tiny size on the CPU and prints a summary that parses."""

from __future__ import annotations

import re

import pytest

from bench import gpu_wan

SUMMARY = re.compile(
    r"^gpu_wan fps_1=(?P<fps>[\d.]+) ttff_s=(?P<ttff>[\d.]+) sessions_at_16fps=(?P<n>\d+) "
    r"batching_gain=(?P<gain>[\d.]+) decode_share=(?P<share>[\d.]+)$"
)


def test_tiny_run_prints_a_row_per_session_count_and_a_parsable_summary(capsys):
    gpu_wan.main(["--tiny", "--sessions", "1", "2", "--chunks", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    m = SUMMARY.match(lines[-1])
    assert m, lines[-1]
    assert float(m["fps"]) > 0 and float(m["ttff"]) > 0 and float(m["gain"]) > 0
    assert 0 <= int(m["n"]) <= 2
    assert 0 < float(m["share"]) < 1
    rows = [ln.split() for ln in lines if re.match(r"^\s+\d+\s", ln)]
    assert [r[0] for r in rows] == ["1", "2"]
    # Steady chunks of the tiny config's 2 latent frames decode to 8 pixel frames each.
    assert {r[5] for r in rows} == {"8"}
    assert any("VAE feature cache 1801 MiB" in ln for ln in lines)


def test_matrix_game_is_a_named_hook_not_a_silent_fallback():
    with pytest.raises(SystemExit, match="matrix-game-2 is not served yet"):
        gpu_wan.main(["--tiny", "--model", "matrix-game-2"])
