"""The AG-UI route, registered without importing AG-UI's SDK: `endpoint.py` (which uses its types, ~0.1-1 s
to import) is imported, off the event loop, by the first AG-UI request, not by every server start."""
from __future__ import annotations

from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...aio import import_in_thread
from ..http import Call, endpoint


def routes() -> list[BaseRoute]:
    return [Route("/api/worlds/{world}/agui", endpoint(agui_run), methods=["POST"])]


async def agui_run(call: Call) -> Response:
    await import_in_thread(f"{__package__}.endpoint")
    from .endpoint import agui_run as run

    return await run(call)
