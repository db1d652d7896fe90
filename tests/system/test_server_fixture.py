"""The test servers' own fixture: a server is only taken as started once it is the one answering."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.server import start_server


def test_a_server_whose_port_another_server_holds_is_not_taken_for_that_one(tmp_path: Path) -> None:
    # Two test workers' servers may get the same free port; the one that loses the bind exits, but the
    # other answered its /healthz: the test then talked to a server that stopped under it.
    first = start_server(tmp_path / "first")
    try:
        with pytest.raises(RuntimeError, match="already in use"):
            start_server(tmp_path / "second", port=first.port).stop()
    finally:
        first.stop()
