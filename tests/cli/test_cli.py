"""The worldserve command line."""

from __future__ import annotations

import argparse

import pytest

from worldserve.cli import router as cli_router
from worldserve.cli.main import main
from worldserve.cli.serve import serve_parser, settings_from
from worldserve.server.settings import Settings


def parse(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    serve_parser(ap)
    return ap.parse_args(argv)


def test_serve_options_become_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLDSERVE_API_KEYS", "b,c")
    s = settings_from(parse(
        "--port", "9001", "--capacity", "3", "--threads", "2", "--warmup-batch-sizes", "1,2",
        "--buckets", "64", "--api-keys", "a", "--api-keys", "d", "--min-steps", "3",
        "--no-batching", "--dtype", "bfloat16", "--device", "cuda:1", "--no-cuda-graphs",
        "--replay-blocks", "4", "--send-queue", "5", "--max-actions-per-s", "60",
    ))
    assert (s.port, s.capacity, s.threads, s.dtype) == (9001, 3, 2, "bfloat16")
    assert (s.device, s.cuda_graphs) == ("cuda:1", False)
    assert s.warmup_batch_sizes == (1, 2) and s.buckets == (64,)
    assert s.api_keys == frozenset({"a", "d"})  # the flag wins over WORLDSERVE_API_KEYS
    assert s.min_steps == 3 and not s.batching
    assert (s.replay_blocks, s.send_queue, s.max_actions_per_s) == (4, 5, 60.0)
    assert settings_from(parse()).api_keys == frozenset({"b", "c"})


def test_defaults_serve_on_loopback_port_8000(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLDSERVE_PORT", raising=False)
    monkeypatch.delenv("WORLDSERVE_HOST", raising=False)
    s = settings_from(parse())
    assert (s.host, s.port, s.threads, s.dtype) == ("127.0.0.1", 8000, 1, "auto")
    assert (s.device, s.cuda_graphs) == ("cpu", True)  # graphs apply on a GPU only


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError, match=r"capacity 0 .*\(set by --capacity\)"):
        settings_from(parse("--capacity", "0"))
    with pytest.raises(ValueError, match="'half'"):
        Settings(dtype="half")
    with pytest.raises(ValueError, match="'gpu'"):
        Settings(device="gpu")


def test_train_delegates_to_training_train(monkeypatch: pytest.MonkeyPatch) -> None:
    from worldserve.training import train as training_train

    seen: list[list[str]] = []
    monkeypatch.setattr(training_train, "main", lambda argv=None: seen.append(argv))
    main(["train", "--minutes", "1", "--out", "x"])
    assert seen == [["--minutes", "1", "--out", "x"]]


def test_scale_out_options_become_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLDSERVE_DIRECTORY_URL", raising=False)
    assert settings_from(parse()).directory_url is None  # the embedded default
    s = settings_from(parse(
        "--directory-url", "redis://127.0.0.1:6390/0", "--advertise", "http://10.0.0.7:8001",
        "--worker-id", "w7", "--admin-key", "k" * 12, "--worker-heartbeat-s", "0.5",
        "--worker-ttl-s", "2", "--snapshot-interval-s", "1.5", "--drain-timeout-s", "9",
        "--placement-threshold", "0.8", "--orphan-ttl-s", "900", "--handover-ttl-s", "45",
    ))
    assert (s.directory_url, s.advertise, s.worker_id) == (
        "redis://127.0.0.1:6390/0", "http://10.0.0.7:8001", "w7")
    assert (s.admin_key, s.worker_heartbeat_s, s.worker_ttl_s) == ("k" * 12, 0.5, 2.0)
    assert (s.snapshot_interval_s, s.drain_timeout_s, s.placement_threshold) == (1.5, 9.0, 0.8)
    assert s.orphan_ttl_s == 900.0 and settings_from(parse()).orphan_ttl_s == 1800.0
    assert s.handover_ttl_s == 45.0 and settings_from(parse()).handover_ttl_s == 30.0
    with pytest.raises(ValueError, match="worker_ttl_s"):
        settings_from(parse("--worker-heartbeat-s", "3", "--worker-ttl-s", "2"))
    with pytest.raises(ValueError, match=r"orphan_ttl_s .* snapshot_ttl_s"):
        settings_from(parse("--orphan-ttl-s", "60"))  # shorter than the checkpoints last
    with pytest.raises(ValueError, match=r"handover_ttl_s .* snapshot_ttl_s"):
        settings_from(parse("--handover-ttl-s", "601"))  # longer than the handoff lasts
    with pytest.raises(ValueError, match="handover_ttl_s"):
        settings_from(parse("--handover-ttl-s", "0"))


def test_router_options_become_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from worldserve.server.cluster.router import RouterSettings

    monkeypatch.setattr(cli_router, "run_site", _no_site)
    monkeypatch.setattr(cli_router, "configure", lambda *args: None)  # leave logging alone
    seen: list[RouterSettings] = []
    monkeypatch.setattr(cli_router, "create_router", lambda settings: seen.append(settings))
    main(["router", "--port", "8099", "--orphan-ttl-s", "1200", "--threshold", "0.7",
              "--handover-ttl-s", "20"])
    assert (seen[0].port, seen[0].orphan_ttl_s, seen[0].threshold) == (8099, 1200.0, 0.7)
    assert seen[0].handover_ttl_s == 20.0
    with pytest.raises(SystemExit, match="orphan_ttl_s"):
        main(["router", "--orphan-ttl-s", "0"])
    with pytest.raises(SystemExit, match="handover_ttl_s"):
        main(["router", "--handover-ttl-s", "nan"])


async def _no_site(*args: object) -> None:
    return None


def test_soak_and_drill_delegate_their_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from worldserve.bench import drill
    from worldserve.clients import soak

    seen: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(soak, "main", lambda argv=None: seen.append(("soak", argv)))
    monkeypatch.setattr(drill, "main", lambda argv=None: seen.append(("drill", argv)))
    main(["soak", "--url", "ws://x/v1/ws"])
    main(["drill", "--quick"])
    assert seen == [("soak", ["--url", "ws://x/v1/ws"]), ("drill", ["--quick"])]


def test_train_names_a_stage_or_trains_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from worldserve.training import observer, tokenizer, train

    seen: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(tokenizer, "main", lambda argv=None: seen.append(("tokenizer", argv)))
    monkeypatch.setattr(observer, "main", lambda argv=None: seen.append(("observer", argv)))
    monkeypatch.setattr(train, "main", lambda argv=None: seen.append(("train", argv)))
    main(["train", "tokenizer", "--minutes", "1"])
    main(["train", "observer", "--steps", "2"])
    main(["train", "--minutes", "1"])
    assert seen == [("tokenizer", ["--minutes", "1"]), ("observer", ["--steps", "2"]), ("train", ["--minutes", "1"])]
