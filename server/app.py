"""The composition root: storage, engine, access and routes, assembled into one Starlette app."""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, cast

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.websockets import WebSocket

from . import offload, vocab
from .api import files as workspace_files
from .api import http, mcp_sign_in, ops
from .api.agui import routes as agui
from .api.auth.sessions import Sessions, _namespace, open_sessions
from .api.auth.tokens import TokenAuth, login
from .api.context import AppContext
from .api.live import json_socket as ws
from .api.live.presence import SharedPresence
from .api.middleware import BodyLimit, SecurityHeaders, WorldWork
from .backends import DEFAULT_PREFIX, DataDirLock, open_backends
from .demo import ensure_demo_world
from .engine.engine import Engine, ProviderFactory
from .errors import AppError
from .log.failures import StorageError
from .metrics import Metrics
from .push import routes as push_routes
from .push.service import close_push, open_push
from .redact import remember_secret
from .runtime import tune_gc, tune_threads
from .tools.mcp.oauth_vault import FileVault, RedisVault, given_key
from .tools.sandbox import warm

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerConfig:
    data_dir: Path
    token: str  # the owner's token
    host: str = "127.0.0.1"
    port: int = 8000
    redis_url: str | None = None
    redis_prefix: str = DEFAULT_PREFIX  # the namespace of this deployment in Redis
    demo: bool = True  # create the demo world when there is none
    url: str | None = None  # --public-url: the address people reach the server by (behind a proxy)
    metrics_token: str | None = None  # --metrics-token: reads /metrics without being the owner
    mcp_oauth_key: str | None = None  # AGENT_WORLD_MCP_OAUTH_KEY: seals OAuth sign-ins, kept beside none of them

    @property
    def public_url(self) -> str:
        if self.url:
            return self.url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"


def extension_routes() -> list[BaseRoute]:
    """Routes of installed extensions (the web app is one), found by entry point."""
    routes: list[BaseRoute] = []
    for entry in entry_points(group="agent_world.extensions"):
        routes.extend(entry.load()())
    return routes


def extension_error_page() -> Callable[[int, str], str] | None:
    """An installed extension's `error_page(status, message)` (the web app's, in the site's layout), if any."""
    for entry in entry_points(group="agent_world.extensions"):
        page = getattr(importlib.import_module(entry.module), "error_page", None)
        if callable(page):
            return cast(Callable[[int, str], str], page)
    return None


async def _app_error(request: Request, exc: Exception) -> Response:
    """One handler for every refusal: JSON for the API, a small page for a browser."""
    assert isinstance(exc, AppError)
    if request.url.path.startswith("/api") or "text/html" not in request.headers.get("accept", ""):
        return JSONResponse(exc.to_json(), status_code=exc.status, headers=exc.headers)
    page = getattr(request.app.state, "error_page", None)
    body = page(exc.status, exc.message) if page is not None else (
        f"<!doctype html><title>{exc.status}</title><h1>{exc.status}</h1>"
        f"<p>{_escape(exc.message)}</p><p><a href='/'>Back to the worlds</a></p>")
    return HTMLResponse(body, status_code=exc.status, headers=exc.headers)


_HTTP_CODES = {404: vocab.NOT_FOUND, 405: "method_not_allowed"}


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 (no such route) in the same shapes as every other error."""
    assert isinstance(exc, HTTPException)
    error = AppError(_HTTP_CODES.get(exc.status_code, "http_error"), str(exc.detail), exc.status_code)
    response = await _app_error(request, error)
    for key, value in (exc.headers or {}).items():
        response.headers[key] = value
    return response


async def _storage_error(conn: HTTPConnection, exc: Exception) -> Response | None:
    """The log cannot be used (a full disk, a read-only folder, Redis down): 503, with the storage's own words;
    a WebSocket is closed with 1013 so its client comes back (with `after=`) once storage is back."""
    method = conn.scope.get("method", "WEBSOCKET")
    logger.error("storage error on %s %s: %s: %s", method, conn.url.path, type(exc).__name__, exc)
    if conn.scope["type"] == "websocket":
        with contextlib.suppress(RuntimeError, OSError):
            await cast(WebSocket, conn).close(code=1013, reason="storage unavailable: reconnect with after=")
        return None
    return await _app_error(cast(Request, conn), AppError("storage_unavailable", f"storage failed: {exc}", 503))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def create_app(config: ServerConfig, *, providers: ProviderFactory | None = None,
               extensions: Sequence[BaseRoute] | None = None) -> Starlette:
    """The whole server. `extensions` defaults to the installed ones."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The server's own secrets are hidden wherever they would leave it, whatever they look like.
        for secret in (config.token, config.metrics_token, config.mcp_oauth_key, os.environ.get("OPENAI_API_KEY")):
            remember_secret(secret)
        embedded = not config.redis_url
        # Each part is stopped in the reverse order of its start, each even when one before it failed to
        # stop, and so is what started before a failed start-up: no engine, sandbox, worker or lock is left
        # behind by a start that failed late (a `vapid.pem` that holds no key) or a stop that met an error.
        async with contextlib.AsyncExitStack() as parts:
            if embedded:
                parts.callback(DataDirLock(config.data_dir).acquire().release)
            event_log, bus = await open_backends(data_dir=config.data_dir, redis_url=config.redis_url,
                                                 redis_prefix=config.redis_prefix)
            parts.push_async_callback(event_log.close)
            parts.push_async_callback(bus.disconnect)
            metrics = Metrics()
            engine = Engine(event_log, bus, data_dir=config.data_dir, providers=providers, metrics=metrics,
                            exclusive=embedded)
            engine.webhooks.public_url = config.public_url  # the queue's link in webhooks
            # OAuth MCP sign-ins, sealed (server/tools/mcp/oauth_vault.py): shared by every process in Redis
            key = given_key(config.mcp_oauth_key) if config.mcp_oauth_key else None
            if config.redis_url:
                # (the distributed mode only: redis is not imported otherwise)
                from .log.redis.connect import connect_redis
                engine.mcp_sign_ins.use_vault(RedisVault(await connect_redis(config.redis_url),
                                                         _namespace(config.redis_prefix), key))
            elif key is not None:
                engine.mcp_sign_ins.use_vault(FileVault(config.data_dir, key))
            parts.callback(offload.shutdown)  # the worker processes, once nothing can ask them for work
            warm.start()  # pre-started shell sandboxes, killed at the end (server/tools/sandbox/warm.py)
            parts.push_async_callback(warm.stop)
            parts.push_async_callback(engine.stop)  # (also after a start that failed half way, or before it)
            if key is not None and (moved := await engine.mcp_sign_ins.vault.adopt_kept_key()):
                logger.warning("sealed %d MCP OAuth sign-ins again under the given key", moved)
            await engine.start(host_in_background=True)  # /healthz answers while the worlds with work are hosted
            if config.demo:
                await ensure_demo_world(engine)
            presence = SharedPresence(engine.store, engine.instance, shared=not embedded)
            await presence.start()
            parts.push_async_callback(presence.stop)
            sessions = await open_sessions(data_dir=config.data_dir, redis_url=config.redis_url,
                                           redis_prefix=config.redis_prefix)
            parts.push_async_callback(sessions.close)
            auth = TokenAuth(config.token, engine, Sessions(sessions), config.public_url)
            await auth.start()
            parts.push_async_callback(auth.stop)
            push = await open_push(engine, presence, data_dir=config.data_dir, redis_url=config.redis_url,
                                   redis_prefix=config.redis_prefix, public_url=config.public_url)
            parts.push_async_callback(close_push, push)
            tune_gc()
            parts.callback(sys.setswitchinterval, tune_threads())
            app.state.ctx = AppContext(engine=engine, auth=auth, presence=presence, metrics=metrics,
                                       public_url=config.public_url,
                                       extra={"metrics_token": config.metrics_token, "push": push})
            parts.push_async_callback(ws.close_all, app.state.ctx, 1012)  # first: the sockets are told
            yield

    routes: list[BaseRoute] = [
        Route("/healthz", ops.healthz), Route("/metrics", ops.metrics), Route("/login", login, methods=["POST"]),
        *http.routes(), *workspace_files.routes(), *mcp_sign_in.routes(), *ws.routes(), *agui.routes(),
        *push_routes.routes(),
        *(extension_routes() if extensions is None else extensions),
    ]
    middleware = [Middleware(SecurityHeaders), Middleware(BodyLimit, larger=workspace_files.upload_cap),
                  Middleware(WorldWork)]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers={AppError: _app_error, HTTPException: _http_error,
                                        StorageError: cast(Any, _storage_error)})
    app.state.error_page = extension_error_page() if extensions is None else None  # a browser's error page
    return app


__all__ = ["ServerConfig", "create_app", "vocab"]
