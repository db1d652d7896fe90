"""Operations endpoints: /healthz (a real round trip to the log and the bus) and /metrics (credentials needed)."""
from __future__ import annotations

import asyncio
import hmac
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from .. import vocab
from ..errors import AppError
from .context import context_of

HEALTH_TIMEOUT = 2.0  # seconds each check may take before it counts as down


async def _timed(check: object) -> str:
    assert asyncio.iscoroutine(check)
    started = time.perf_counter()
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT):
            await check
    except TimeoutError:
        return f"down: no answer within {HEALTH_TIMEOUT:g} s"
    except Exception as exc:
        return f"down: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}".rstrip(": ")
    return f"ok ({(time.perf_counter() - started) * 1000:.1f} ms)"


async def healthz(request: Request) -> Response:
    """GET /healthz: {"status": "ok"|"down", "log": …, "bus": …}; 503 when either is down."""
    engine = context_of(request).engine

    log, bus = await asyncio.gather(_timed(engine.log_round_trip()), _timed(engine.bus_round_trip()))
    up = log.startswith("ok") and bus.startswith("ok")
    return JSONResponse({"status": "ok" if up else "down", "log": log, "bus": bus}, status_code=200 if up else 503,
                        headers={"Cache-Control": "no-store"})


def _bearer(request: Request) -> str:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


async def metrics(request: Request) -> Response:
    """GET /metrics: Prometheus text for the owner or the holder of the metrics token.

    Cheap by construction: every gauge is kept up to date from events; the token gauges read only the
    events appended since the previous read (server/engine/world/usage.py).
    """
    ctx = context_of(request)
    metrics_token = ctx.extra.get("metrics_token") or ""
    token = _bearer(request)
    allowed = bool(metrics_token) and hmac.compare_digest(token.encode(), metrics_token.encode())
    if not allowed:
        principal = await ctx.auth.authenticate(request)
        if principal is None:
            raise AppError("unauthorized", "metrics need Authorization: Bearer <owner or metrics token>", status=401)
        if not principal.owner:
            raise AppError(vocab.FORBIDDEN, "only the owner (or the metrics token) reads metrics")
    await ctx.engine.usage.refresh_metrics()
    return PlainTextResponse(ctx.metrics.render(), media_type="text/plain; version=0.0.4")
