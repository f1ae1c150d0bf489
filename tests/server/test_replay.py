"""A served session's log replays frame for frame (model/replay.py, session/logfile.py).

The server runs the default model in float32 with batches of one, as a session an operator
wants to reproduce would be served; the client steers it (keys, mouse, a new prompt, a real
frame), then ``GET /admin/sessions/{id}/log`` is replayed by ``worldserve replay`` on a fresh
runner and every block must come out identical to what the client received.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from tests.server.harness import frames, recv, recv_type, send
from tests.server.test_e2e_model import image, model_server, smallest_bucket
from worldserve.cli.main import main as cli_main
from worldserve.protocol import Ack, Action, Frame, Image, Observation, Prompt, Start, Started
from worldserve.session import logfile
from worldserve.session.eventlog import ActionEvent, ObservationEvent, SceneEvent

ADMIN = {"Authorization": "Bearer admin-key-1"}


async def _fetch_log(s, sid: str) -> bytes:  # type: ignore[no-untyped-def]
    async with s.http.get(s.url(f"/admin/sessions/{sid}/log"), headers=ADMIN) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.content_type == "application/msgpack"
        return await resp.read()


@pytest.mark.slow
async def test_a_served_session_replays_frame_for_frame(
    model_weights: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = smallest_bucket(model_weights)
    async with model_server(model_weights, dtype="float32", warmup_batch_sizes=(1,),
                            admin_key="admin-key-1") as s:
        ws = await s.connect()
        await send(ws, Start("a green forest", seed=11, fps=8.0, bucket=bucket, codec="raw"))
        started = await recv(ws)
        assert isinstance(started, Started)
        got = await frames(ws, 4)
        await send(ws, Action(1, keys=("forward",)))
        got += await frames(ws, 4)
        await send(ws, Action(2, keys=("left",), mouse=(0.5, 0.0)))
        got += await frames(ws, 3)
        await send(ws, Prompt("a snowy forest at night", id=1))
        await recv_type(ws, Ack, skip=(Frame,))
        got += await frames(ws, 4)
        real = np.full((bucket, bucket, 3), 90, np.uint8)
        real[:, : bucket // 2] = 200
        await send(ws, Observation(Image("raw", real.tobytes(), real.shape, "uint8"), id=2))
        await recv_type(ws, Ack, skip=(Frame,))
        got += await frames(ws, 4)
        data = await _fetch_log(s, started.session_id)

        # the log names what the client did, against the blocks it applied to
        lf = logfile.read(data)
        kinds = [type(e) for e in lf.log]
        assert kinds.count(ActionEvent) == 2 and SceneEvent in kinds
        observed = [e for e in lf.log if isinstance(e, ObservationEvent)]
        assert len(observed) == 2  # the start frame and the client's
        assert observed[0].block_idx == 0 and np.array_equal(observed[1].frame, real)
        assert lf.dtype == "float32" and lf.model == "default"
        assert lf.reference == "canvas"  # served on the world canvas (the default): the replay loads one too

        # a missing session is an explicit error
        async with s.http.get(s.url("/admin/sessions/nope/log"), headers=ADMIN) as resp:
            assert resp.status == 404
        async with s.http.get(s.url(f"/admin/sessions/{started.session_id}/log")) as resp:
            assert resp.status == 401
        await ws.close()

    path = tmp_path / "session.log"
    path.write_bytes(data)
    out = tmp_path / "replay"
    # the replay's model is built in this thread: off the test's event loop
    await asyncio.to_thread(
        cli_main, ["replay", str(path), "--weights", str(model_weights), "--out", str(out)]
    )
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    n = len(lf.outputs)
    assert f"checked={n} identical={n} first_difference=-" in summary, summary
    made = np.load(out / "frames.npz")["frames"]
    by_block = {f.block_idx: image(f).astype(np.uint8) for f in got}
    for block, frame in by_block.items():
        assert np.array_equal(made[block], frame), f"block {block} differs from what was served"


def test_a_file_that_is_not_a_session_log_is_refused(tmp_path: Path) -> None:
    with pytest.raises(logfile.SnapshotError, match="not a session log"):
        logfile.read(b"\x80")
    bad = tmp_path / "bad.log"
    bad.write_bytes(b"not msgpack at all \xc1")
    with pytest.raises(SystemExit, match="worldserve replay: bad log file: not valid msgpack"):
        cli_main(["replay", str(bad)])


def test_a_log_says_what_its_session_s_model_read_beside_its_cache() -> None:
    import msgpack

    from worldserve.session.session import Session, SessionConfig, hash_token

    s = Session(SessionConfig(), hash_token("t"), scene="a green forest")
    assert logfile.read(logfile.pack(s, "default", "float32", "canvas")).reference == "canvas"
    assert logfile.read(logfile.pack(s, "default", "float32", "anchor")).reference == "anchor"
    doc = msgpack.unpackb(logfile.pack(s, "default", "float32"), raw=False)
    del doc["reference"]
    assert logfile.read(msgpack.packb(doc, use_bin_type=True)).reference == ""
    doc["canvas"] = True  # a log of an earlier worker: a flag
    assert logfile.read(msgpack.packb(doc, use_bin_type=True)).reference == "canvas"
    doc["canvas"] = "yes"
    with pytest.raises(logfile.SnapshotError, match=r"log file\.canvas"):
        logfile.read(msgpack.packb(doc, use_bin_type=True))
