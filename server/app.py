"""The composition root: storage, engine, access and routes, assembled into one Starlette app."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from . import vocab
from .api import http, ws
from .api.auth import TokenAuth, login
from .api.context import AppContext
from .api.presence import SharedPresence
from .backends import DEFAULT_PREFIX, DataDirLock, open_backends
from .demo import ensure_demo_world
from .engine.engine import Engine, ProviderFactory
from .errors import AppError
from .metrics import Metrics
from .runtime import tune_gc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerConfig:
    data_dir: Path
    token: str  # the owner's token
    host: str = "127.0.0.1"
    port: int = 8000
    redis_url: str | None = None
    redis_prefix: str = DEFAULT_PREFIX  # the namespace of this deployment in Redis
    demo: bool = True  # create the demo world when there is none

    @property
    def public_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"


def extension_routes() -> list[BaseRoute]:
    """Routes of installed extensions (the web app is one), found by entry point."""
    routes: list[BaseRoute] = []
    for entry in entry_points(group="agent_world.extensions"):
        routes.extend(entry.load()())
    return routes


async def _healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def _metrics(request: Request) -> Response:
    ctx: AppContext = request.app.state.ctx
    await ctx.engine.refresh_gauges()
    return PlainTextResponse(ctx.metrics.render(), media_type="text/plain; version=0.0.4")


async def _app_error(request: Request, exc: Exception) -> Response:
    """One handler for every refusal: JSON for the API, a small page for a browser."""
    assert isinstance(exc, AppError)
    if request.url.path.startswith("/api") or "text/html" not in request.headers.get("accept", ""):
        return JSONResponse(exc.to_json(), status_code=exc.status)
    return HTMLResponse(f"<!doctype html><title>{exc.status}</title><h1>{exc.status}</h1>"
                        f"<p>{_escape(exc.message)}</p><p><a href='/'>Back to the worlds</a></p>",
                        status_code=exc.status)


_HTTP_CODES = {404: vocab.NOT_FOUND, 405: "method_not_allowed"}


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 (no such route) in the same shapes as every other error."""
    assert isinstance(exc, HTTPException)
    error = AppError(_HTTP_CODES.get(exc.status_code, "http_error"), str(exc.detail), exc.status_code)
    response = await _app_error(request, error)
    for key, value in (exc.headers or {}).items():
        response.headers[key] = value
    return response


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def create_app(config: ServerConfig, *, providers: ProviderFactory | None = None,
               extensions: Sequence[BaseRoute] | None = None) -> Starlette:
    """The whole server. `extensions` defaults to the installed ones."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        embedded = not config.redis_url
        lock = DataDirLock(config.data_dir).acquire() if embedded else None
        event_log, bus = await open_backends(data_dir=config.data_dir, redis_url=config.redis_url,
                                             redis_prefix=config.redis_prefix)
        metrics = Metrics()
        engine = Engine(event_log, bus, data_dir=config.data_dir, providers=providers, metrics=metrics,
                        exclusive=embedded)
        await engine.start()
        if config.demo:
            await ensure_demo_world(engine)
        presence = SharedPresence(engine.store, engine.instance, shared=not embedded)
        await presence.start()
        tune_gc()
        app.state.ctx = AppContext(engine=engine, auth=TokenAuth(config.token, engine),
                                   presence=presence, metrics=metrics, public_url=config.public_url)
        try:
            yield
        finally:
            await ws.close_all(app.state.ctx, code=1012)
            await presence.stop()
            await engine.stop()
            await bus.disconnect()
            await event_log.close()
            if lock is not None:
                lock.release()

    routes: list[BaseRoute] = [
        Route("/healthz", _healthz), Route("/metrics", _metrics), Route("/login", login),
        *http.routes(), *ws.routes(),
        *(extension_routes() if extensions is None else extensions),
    ]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={AppError: _app_error, HTTPException: _http_error})


__all__ = ["ServerConfig", "create_app", "vocab"]
