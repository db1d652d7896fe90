"""ASGI middleware around the whole app: security headers on every response, a cap on every request body,
and whose work a request does."""
from __future__ import annotations

import json
import re
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import offload
from ..errors import AppError
from .bodies import MAX_BODY, TOO_LARGE

# No inline script or style anywhere (the htmx config is a <meta>); nothing may frame a page.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)
_START = {"http.response.start", "websocket.http.response.start"}


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every response that does not set its own (e.g. a stricter Referrer-Policy)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)

        async def send_with_headers(message: Message) -> None:
            if message["type"] in _START:
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(name, value) for name, value in SECURITY_HEADERS if name not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class BodyLimit:
    """Every HTTP request body is capped at `limit` bytes, whatever the route and content type.

    A declared Content-Length over the cap is answered 413 before the app runs; otherwise the bytes
    are counted as the app reads them (a lying or absent Content-Length cannot get past), and the
    read that crosses the cap raises a 413 `AppError` inside the route, which answers it.
    """

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY,
                 larger: Callable[[str, str], int | None] | None = None) -> None:
        self.app = app
        self.limit = limit
        self.larger = larger  # (path, method) -> the cap of a route with its own (uploads), or None

    def _error(self, limit: int) -> AppError:
        return AppError(TOO_LARGE, f"request body larger than {limit} bytes", status=413)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = (self.larger(scope["path"], scope["method"]) if self.larger else None) or self.limit
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            body = json.dumps(self._error(limit).to_json()).encode()
            await send({"type": "http.response.start", "status": 413,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise self._error(limit)
            return message

        await self.app(scope, counted, send)


_WORLD_PATH = re.compile(r"/(?:api/worlds|w)/([^/]+)")  # a world's API, sockets and pages


class WorldWork:
    """A request or socket under a world's path does that world's work: what it sends to the worker
    processes shares the world's room there (server/offload.py `working_for`), so that one busy world leaves
    the others theirs."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and (world := _WORLD_PATH.match(scope["path"])):
            offload.working_for(world[1])
        await self.app(scope, receive, send)
