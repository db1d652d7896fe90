"""`GET /sw.js`: Web Push's service worker, served at the root so that its scope covers every page."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import FileResponse, Response

from .render import STATIC


async def service_worker(request: Request) -> Response:
    return FileResponse(STATIC / "sw.js", media_type="text/javascript",
                        headers={"Service-Worker-Allowed": "/", "Cache-Control": "no-cache"})
