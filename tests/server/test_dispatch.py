"""server/dispatch.py on its own: the rate limit, decoding and routing both transports share."""

from __future__ import annotations

from typing import Any, cast

import pytest

from worldserve.protocol import (
    Ack,
    Action,
    Block,
    Close,
    Error,
    ErrorCode,
    Keyframe,
    Observation,
    Ping,
    Pong,
    Prompt,
    ProtocolError,
    Resume,
    ServerMessage,
    Start,
)
from worldserve.server.dispatch import Inbound, dispatch
from worldserve.server.metrics import Metrics
from worldserve.server.service import Service
from worldserve.server.settings import Settings
from worldserve.session.errors import SessionError


class FakeTransport:
    def __init__(self, sid: str | None = "s1") -> None:
        self.sid = sid
        self.sent: list[ServerMessage] = []
        self.keyframes = 0

    def send(self, msg: ServerMessage) -> None:
        self.sent.append(msg)

    def need_session(self) -> str:
        if self.sid is None:
            raise ProtocolError("no session", "type", ErrorCode.NOT_STARTED)
        return self.sid

    def request_keyframe(self) -> None:
        self.keyframes += 1


class FakeService:
    """The service and its ``inputs`` in one."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.inputs = self

    def action(self, sid: str, msg: Action) -> None:
        self.calls.append(("action", sid, msg))

    async def prompt(self, sid: str, msg: Prompt) -> Ack:
        self.calls.append(("prompt", sid, msg))
        return Ack("prompt", msg.id)

    async def observe(self, sid: str, msg: Observation) -> Ack:
        self.calls.append(("observe", sid, msg))
        return Ack("observation", msg.id)

    async def block(self, sid: str, msg: Block) -> None:
        self.calls.append(("block", sid, msg))

    def close(self, sid: str, reason: str) -> bool:
        self.calls.append(("close", sid, reason))
        return True

    def live(self, sid: str) -> None:  # no Live to mark heard
        return None


async def _route(msg: Any, transport: FakeTransport | None = None) -> tuple[FakeService, FakeTransport]:
    svc, tr = FakeService(), transport or FakeTransport()
    await dispatch(cast(Service, svc), tr, msg)
    return svc, tr


async def test_session_messages_reach_the_service_for_the_transports_session() -> None:
    svc, tr = await _route(Action(3, ("forward",)))
    assert svc.calls == [("action", "s1", Action(3, ("forward",)))] and tr.sent == []
    svc, tr = await _route(Prompt("a desert", 7))
    assert svc.calls[0][:2] == ("prompt", "s1") and tr.sent == [Ack("prompt", 7)]
    svc, tr = await _route(Block(4))
    assert svc.calls == [("block", "s1", Block(4))]
    svc, tr = await _route(Close("done"))
    assert svc.calls == [("close", "s1", "client_close")]
    svc, tr = await _route(Keyframe())
    assert svc.calls == [] and tr.keyframes == 1


async def test_ping_needs_no_session_and_the_others_do() -> None:
    svc, tr = await _route(Ping(5), FakeTransport(sid=None))
    assert svc.calls == [] and len(tr.sent) == 1
    assert isinstance(tr.sent[0], Pong) and tr.sent[0].id == 5
    for msg in (Action(1), Prompt("x"), Block(0), Keyframe(), Close()):
        with pytest.raises(ProtocolError) as info:
            await _route(msg, FakeTransport(sid=None))
        assert info.value.code == ErrorCode.NOT_STARTED


async def test_start_and_resume_are_left_to_the_transport() -> None:
    for msg in (Start(), Resume("rAgB56B7Gj59qRAE", "t", 0)):
        with pytest.raises(ProtocolError, match="unhandled message") as info:
            await _route(msg)
        assert info.value.field == "type"


async def test_service_errors_propagate_to_the_transport() -> None:
    class Failing(FakeService):
        def action(self, sid: str, msg: Action) -> None:
            raise SessionError("nope")

    with pytest.raises(SessionError):
        await dispatch(cast(Service, Failing()), FakeTransport(), Action(1))


def test_inbound_drops_over_the_rate_with_one_error_a_second() -> None:
    now = [100.0]
    inbound = Inbound(Settings(max_msgs_per_s=1.0, msg_burst=2), Metrics(), clock=lambda: now[0])
    errors: list[Error] = []
    assert inbound.admit(errors.append) and inbound.admit(errors.append)
    assert not inbound.admit(errors.append) and not inbound.admit(errors.append)
    assert len(errors) == 1 and errors[0].code == ErrorCode.RATE_LIMITED
    assert errors[0].retry_after is not None and 0.0 < errors[0].retry_after <= 1.0
    now[0] += 1.0  # one token back, and the next refusal may say so again
    assert inbound.admit(errors.append)
    assert not inbound.admit(errors.append) and len(errors) == 2


def test_inbound_decodes_counts_and_refuses_bad_bytes() -> None:
    metrics = Metrics()
    inbound = Inbound(Settings(), metrics)
    assert inbound.decode(Ping(9).encode()) == Ping(9)
    counted = metrics.registry.get_sample_value("worldserve_messages_received_total", {"type": "ping"})
    assert counted == 1.0
    with pytest.raises(ProtocolError):
        inbound.decode(b"\xc1")
