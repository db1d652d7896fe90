"""deploy/nginx.conf while the storage is down: the replicas answer 503 `storage_unavailable` (Redis is
shared, so every replica says the same), and nginx must pass that answer on, not count it as a dead
replica. Counted (`proxy_next_upstream … http_503` with `max_fails=1`), two such answers took both
replicas out for `fail_timeout`: clients got nginx's HTML 502 instead of the JSON error, and every
request (static files, pages, WebSockets) kept getting 502 for up to 5 s after Redis was back."""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.fixtures.proxy import Nginx, start_nginx
from tests.fixtures.server import free_port

DOWN = {"status": "down", "log": "down: no answer within 2 s", "bus": "down: no answer within 2 s"}


class Replica:
    """A stand-in replica that answers as `serve` does while Redis is down: 503 and a JSON body."""

    def __init__(self) -> None:
        self.storage_down = threading.Event()
        replica = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                if self.path == "/healthz" and replica.storage_down.is_set():
                    status, body = 503, json.dumps(DOWN).encode()
                else:
                    status, body = 200, b'{"status": "ok"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[Nginx, list[Replica]]]:
    replicas = [Replica(), Replica()]
    proxy = start_nginx(tmp_path / "nginx", [f"127.0.0.1:{r.port}" for r in replicas], free_port())
    try:
        yield proxy, replicas
    finally:
        proxy.stop()
        for replica in replicas:
            replica.close()


def test_a_storage_outage_reaches_clients_as_the_apps_503_and_leaves_the_replicas_in_service(
        proxied: tuple[Nginx, list[Replica]]) -> None:
    proxy, replicas = proxied
    for replica in replicas:
        replica.storage_down.set()
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        for _ in range(3):  # e.g. the compose healthcheck, and people's requests
            answer = client.get("/healthz")
            assert answer.status_code == 503, answer.text
            assert answer.json() == DOWN
        for replica in replicas:
            replica.storage_down.clear()  # Redis is back
        for path in ("/static/app.css", "/healthz", "/api/me", "/static/app.css"):
            answer = client.get(path)
            assert answer.status_code == 200, (path, answer.status_code, answer.text[:80], proxy.log()[-600:])
