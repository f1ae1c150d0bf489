"""Where the SDK follows a router or a migrate: the host it was given (and allowed_hosts),
never from wss/https down to ws, since it sends its API key and resume token there."""

from __future__ import annotations

import pytest

from worldserve.clients.sdk import SessionEnded, WorldClient


def test_a_redirect_to_another_host_is_refused() -> None:
    client = WorldClient(router="http://router.example:8080")
    assert client._followed("ws://router.example:9001/v1/ws", "a migrate") == "ws://router.example:9001/v1/ws"
    with pytest.raises(SessionEnded, match="allowed_hosts"):
        client._followed("ws://evil.example/v1/ws", "a migrate")


def test_allowed_hosts_extend_where_it_may_go() -> None:
    client = WorldClient(router="https://router.example", allowed_hosts=("w1.example",))
    assert client._followed("wss://w1.example/v1/ws", "the router's place")


def test_a_secure_client_never_goes_down_to_plain_ws() -> None:
    client = WorldClient("wss://w0.example/v1/ws")
    with pytest.raises(SessionEnded):
        client._followed("ws://w0.example/v1/ws", "a migrate")
    with pytest.raises(SessionEnded):
        client._followed(None, "the router's resume")
