"""One name per setting: flags and environment variables made from the settings fields."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from worldserve.cli.main import main as cli_main
from worldserve.cli.router import router_parser
from worldserve.cli.serve import serve_parser
from worldserve.server.cluster.router import RouterSettings
from worldserve.server.flags import PREFIX, Option, build, options, show
from worldserve.server.settings import IceServer, RtcSettings, Settings


def serve_args(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="worldserve serve")
    serve_parser(ap)
    return ap.parse_args(argv)


def as_text(value: object) -> str:
    """A default written as a user would write it."""
    return {"empty": "", "on": "1", "off": "0"}.get(show(value), show(value))


@pytest.mark.parametrize("cls", [Settings, RouterSettings])
def test_every_setting_has_one_flag_and_one_variable_of_its_own_name(cls: type) -> None:
    opts = options(cls)
    for o in opts:
        name = "_".join(o.path)
        assert o.flag == "--" + name.replace("_", "-") and o.env == PREFIX + name.upper()
        assert len(o.help) > 10, o.flag
    assert len({o.flag for o in opts}) == len(opts) == len({o.env for o in opts})
    ap = argparse.ArgumentParser(prog="worldserve", formatter_class=argparse.RawTextHelpFormatter)
    (serve_parser if cls is Settings else router_parser)(ap)
    text = ap.format_help()
    for o in opts:
        assert o.flag in text and o.env in text


def test_webrtc_and_the_settings_without_a_flag_before_have_one_now() -> None:
    flags = {o.flag for o in options(Settings)}
    assert {"--replay-blocks", "--send-queue", "--max-actions-per-s", "--rtc-codecs",
            "--rtc-ice-servers", "--rtc-loopback-candidates", "--rtc-enabled"} <= flags
    assert {o.flag for o in options(Settings) if o.path[0] == "rtc"} == {
        "--rtc-" + name.replace("_", "-") for name in RtcSettings.__dataclass_fields__}


@pytest.mark.parametrize("o", options(Settings), ids=lambda o: o.flag)
def test_each_default_written_as_text_reads_back_the_same_by_flag_and_by_variable(o: Option) -> None:
    text = as_text(o.default)
    argv = ([o.flag] if o.default else ["--no-" + o.flag[2:]]) if o.type is bool else [o.flag, text]
    by_flag = build(Settings, serve_args(*argv), {})
    by_env = build(Settings, serve_args(), {o.env: text})
    assert by_flag == by_env == Settings()


def test_a_flag_wins_over_its_variable_and_the_variable_over_the_default() -> None:
    env = {"WORLDSERVE_PORT": "9100", "WORLDSERVE_BATCHING": "off", "WORLDSERVE_RTC_CODECS": "VP8",
           "WORLDSERVE_REPLAY_BLOCKS": "5"}
    s = build(Settings, serve_args("--port", "9200", "--batching", "--rtc-codecs", "h264,vp8"), env)
    assert (s.port, s.batching, s.rtc.codecs, s.replay_blocks) == (9200, True, ("H264", "VP8"), 5)
    s = build(Settings, serve_args(), env)
    assert (s.port, s.batching, s.rtc.codecs, s.replay_blocks) == (9100, False, ("VP8",), 5)
    assert build(Settings, serve_args(), {}) == Settings()


def test_values_of_every_kind_are_read() -> None:
    ice = json.dumps([{"urls": "turn:turn.example:3478", "username": "u", "credential": "p"}])
    s = build(Settings, serve_args(
        "--sizes", "480x832,240X416", "--weights", "w", "--threads", "", "--warmup-steps", "2,4",
        "--rtc-ice-servers", ice, "--log-format", "json", "--max-msgs-per-s", "1e3",
    ), {"WORLDSERVE_DIRECTORY_URL": "redis://h:6379/0", "WORLDSERVE_ADVERTISE": ""})
    assert s.sizes == ((480, 832), (240, 416)) and s.weights == Path("w") and s.threads is None
    assert s.warmup_steps == (2, 4) and s.log_format == "json" and s.max_msgs_per_s == 1000.0
    assert s.rtc.ice_servers == (IceServer(("turn:turn.example:3478",), "u", "p"),)
    assert s.directory_url == "redis://h:6379/0" and s.advertise is None


def test_a_bad_flag_value_names_the_flag_and_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, words in [(("--port", "eighty"), ("--port", "'eighty'", "integer")),
                        (("--sizes", "480by832"), ("--sizes", "'480by832'", "HxW")),
                        (("--rtc-loopback-candidates", "sometimes"), ("--rtc-loopback-candidates",
                                                                      "'sometimes'", "auto"))]:
        with pytest.raises(SystemExit):
            serve_args(*argv)
        err = capsys.readouterr().err
        assert all(w in err for w in words), err


def test_a_bad_variable_names_the_variable_and_the_value() -> None:
    with pytest.raises(ValueError, match=r"WORLDSERVE_CAPACITY='lots': expected an integer"):
        build(Settings, serve_args(), {"WORLDSERVE_CAPACITY": "lots"})
    with pytest.raises(ValueError, match=r"WORLDSERVE_RTC_ENABLED='maybe'"):
        build(Settings, serve_args(), {"WORLDSERVE_RTC_ENABLED": "maybe"})


def test_a_value_the_settings_refuse_says_where_it_came_from() -> None:
    with pytest.raises(ValueError, match=r"replay_blocks 0 .*\(set by WORLDSERVE_REPLAY_BLOCKS\)"):
        build(Settings, serve_args(), {"WORLDSERVE_REPLAY_BLOCKS": "0"})
    with pytest.raises(ValueError, match=r"min_bitrate .*\(set by --rtc-min-bitrate\)"):
        build(Settings, serve_args("--rtc-min-bitrate", "9000000"), {})
    with pytest.raises(ValueError, match=r"canvas_decode 'sideways' must be one of .*\(set by --canvas-decode\)"):
        build(Settings, serve_args("--canvas-decode", "sideways"), {})
    assert build(Settings, serve_args("--canvas-decode", "beside"), {}).canvas_decode == "beside"
    with pytest.raises(ValueError, match=r"canvas_trust -1.0 must be .*\(set by --canvas-trust\)"):
        build(Settings, serve_args("--canvas-trust", "-1"), {})
    assert build(Settings, serve_args("--canvas-trust", "2"), {}).canvas_trust == 2.0
    with pytest.raises(ValueError, match=r"canvas_sharpen -0.5 must be .*\(set by --canvas-sharpen\)"):
        build(Settings, serve_args("--canvas-sharpen", "-0.5"), {})
    assert build(Settings, serve_args("--canvas-sharpen", "0"), {}).canvas_sharpen == 0.0
    with pytest.raises(SystemExit, match=r"worldserve serve: bad setting: capacity 0"):
        cli_main(["serve", "--capacity", "0"])
