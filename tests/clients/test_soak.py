"""The soak tester against a server with the fake runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from tests.server.harness import serve
from worldserve.clients import soak


@pytest.mark.parametrize("mode", ["push", "pull"])
async def test_a_short_soak_reports_latency_rss_and_a_plot(
    tmp_path: Path, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "soak.json"
    async with serve() as s:
        args = soak.parse_args([
            "--url", s.ws_url, "--sessions", "2", "--duration", "2", "--fps", "20",
            "--action-period", "0.2", "--scrape", "0.3", "--mode", mode, "--out", str(out),
        ])
        report = await soak.run_soak(args)
    soak.plot(report, tmp_path / "soak.png")
    report.pop("_series")
    assert report["errors"] == 0, report["error_messages"]
    assert report["frames"] > 20 and report["blocks_missing"] == 0
    assert 0 < report["interval_ms"]["p50"] <= report["interval_ms"]["p99"] < 1000
    assert 0 < report["action_to_frame_ms"]["p50"] < 1000
    (samples,) = report["rss_bytes"].values()
    assert len(samples) >= 3 and all(v > 10 * 2**20 for _, v in samples)
    json.dumps(report)
    with Image.open(tmp_path / "soak.png") as img:
        assert img.format == "PNG" and img.size[0] >= 800


def test_the_last_line_has_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fake = {"sessions": 3, "duration_s": 1.0, "fps": 8.0, "mode": "push", "codec": "jpeg",
            "frames": 10, "interval_ms": {"p50": 120.0, "p99": 180.5},
            "action_to_frame_ms": {"p50": 90.0, "p99": 150.0}, "skipped_frames": 0,
            "deadline_misses": 0, "drops": 0, "blocks_missing": 0, "errors": 1,
            "rss_bytes": {"http://w/metrics": [(0.0, 1e8), (1.0, 1.01e8)]}, "rss_growth": 0.01,
            "_series": {"intervals": [(0.5, 120.0), (1.5, 130.0)]}}

    async def run(args: object) -> dict[str, object]:
        return dict(fake)

    monkeypatch.setattr(soak, "run_soak", run)
    soak.main(["--url", "ws://x/v1/ws", "--out", str(tmp_path / "r.json")])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "soak sessions=3 errors=1 rss_growth=0.0100 p99_interval_ms=180.5"
    assert (tmp_path / "r.png").exists() and json.loads((tmp_path / "r.json").read_text())["errors"] == 1
