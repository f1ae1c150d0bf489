"""worldserve.bench.gpu_wan runs its whole loop at a tiny size on the CPU and prints a summary that parses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from worldserve.bench import gpu_wan

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


def test_matrix_game_runs_the_loop_with_its_actions_and_adds_the_key_to_frame_estimate(capsys):
    gpu_wan.main(["--tiny", "--model", "matrix-game-2", "--sessions", "1", "2", "--chunks", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    m = re.match(SUMMARY.pattern.rstrip("$") + r" key_ms_p50=(?P<key>[\d.]+)$", lines[-1])
    assert m, lines[-1]
    assert float(m["fps"]) > 0 and float(m["ttff"]) > 0 and 0 < float(m["share"]) < 1
    assert any("action modules in 1 blocks" in ln and "3 steps + commit" in ln and "sinks 0" in ln for ln in lines)
    # what a session holds at the real size: the figures of docs/model-families.md
    assert any("KV cache 464 MiB, mouse cache 155 MiB" in ln and "VAE feature cache 1016 MiB" in ln for ln in lines)
    header = next(ln for ln in lines if ln.lstrip().startswith("sessions"))
    assert header.split()[-6:] == ["key", "p50", "ms", "key", "max", "ms"]
    rows = [ln.split() for ln in lines if re.match(r"^\s+\d+\s", ln)]
    assert [r[0] for r in rows] == ["1", "2"] and {r[5] for r in rows} == {"8"}
    for r in rows:  # the chunk end to end, then half a period (p50) or a whole one (max) before it
        serial, p50, worst = float(r[3]), float(r[-2]), float(r[-1])
        assert serial < p50 < worst <= 2 * serial + 0.2  # each printed to 0.1
    assert float(m["key"]) == float(rows[0][-2])


def test_matrix_game_at_the_real_size_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(gpu_wan.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        gpu_wan.main(["--model", "matrix-game-2"])


@pytest.mark.parametrize("model", ["wan-causal", "matrix-game-2"])
def test_tae_decodes_in_the_loop_and_its_decode_share_is_reported(capsys, model):
    gpu_wan.main(["--tiny", "--model", model, "--sessions", "1", "--chunks", "1", "--vae", "tae"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(ln.startswith("decoder: TAEHV") for ln in lines)
    m = re.match(SUMMARY.pattern.rstrip("$"), lines[-1])
    assert m, lines[-1]
    assert 0 < float(m["share"]) < 1


def test_rolling_forcing_runs_its_window_sampler_in_the_loop_with_its_settings(capsys):
    gpu_wan.main(["--tiny", "--recipe", "rolling-forcing", "--sessions", "1", "--chunks", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert any("sinks 3 + window 18; 5 steps + commit" in ln for ln in lines)
    rows = [ln.split() for ln in lines if re.match(r"^\s+\d+\s", ln)]
    assert [r[0] for r in rows] == ["1"] and rows[0][5] == "12"  # one 3-latent-frame block a tick
    assert SUMMARY.match(lines[-1]), lines[-1]


def test_the_per_recipe_script_runs_each_named_recipe_at_tiny_size(tmp_path):
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "TINY": "1", "ONLY": "causvid", "PYTHON": sys.executable}
    out = subprocess.run(["bash", str(root / "bench" / "gpu_wan_recipes.sh"), str(tmp_path)], env=env, cwd=root,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    assert out.splitlines()[0] == "== causvid" and SUMMARY.match(out.splitlines()[-1]), out
    assert (tmp_path / "causvid.txt").exists() and not (tmp_path / "self-forcing.txt").exists()
