"""An address past its connection cap is refused (server/http_edge.py), and the operator reads so in the
log: one line an address at most a minute, with how many were refused since the last."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from server.http_edge import ConnectionCounts


class Peer(asyncio.BaseTransport):
    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return (self.address, 40000) if name == "peername" else default


def test_refused_connections_are_logged_once_a_minute_an_address_with_their_count(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    counts = ConnectionCounts(cap=2)
    held = [Peer("203.0.113.7") for _ in range(2)]
    assert all(counts.admit(peer) for peer in held)
    with caplog.at_level(logging.WARNING, logger="server.http_edge"):
        assert not any(counts.admit(Peer("203.0.113.7")) for _ in range(5))
        assert counts.admit(Peer("198.51.100.1"))  # another address is not held back
        now[0] += 61
        assert not counts.admit(Peer("203.0.113.7"))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["refused 1 connection(s) from 203.0.113.7: it holds 2 open, its cap (--connections-per-address)",
                     "refused 5 connection(s) from 203.0.113.7: it holds 2 open, its cap (--connections-per-address)"]
    counts.release(held[0])
    assert counts.admit(Peer("203.0.113.7"))  # one closed: the next is let in
