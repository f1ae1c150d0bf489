"""The admin log endpoint packs a copy of the log off the event loop: a capture taken on
the loop does not change while the session goes on."""

from __future__ import annotations

import numpy as np

from worldserve.session import logfile
from worldserve.session.eventlog import Applied
from worldserve.session.session import Session, SessionConfig


def _applied(seq: int) -> Applied:
    return Applied(64, 4, np.full((1, 6), seq, np.float32), seq)


def test_a_capture_is_a_copy_that_encodes_off_the_loop() -> None:
    session, _ = Session.create(SessionConfig())
    session.record_block(0, _applied(1), np.zeros((1, 8, 8, 3), np.uint8))
    captured = logfile.capture(session, "default", "float32")
    session.record_block(1, _applied(2), np.ones((1, 8, 8, 3), np.uint8))  # after the capture
    read = logfile.read(logfile.encode(captured))
    assert len(read.log) == 1 and list(read.outputs) == [0]
