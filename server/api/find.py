"""Find and take away over HTTP (issue #31 item 8): search a world's chats, export a chat as Markdown."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.responses import Response

from ..errors import AppError
from .auth.tokens import TOO_MANY
from .bodies import query_int

if TYPE_CHECKING:
    from .http import Call

SEARCH_PAGE, MAX_SEARCH_PAGE = 50, 200


async def search(call: Call) -> list[dict[str, Any]]:
    """GET /api/worlds/{world}/search?q=…[&chat=C&limit=N]: the messages holding `q`, newest first."""
    _check_searches(call)
    params = call.request.query_params
    limit = query_int(call.request, "limit", SEARCH_PAGE, minimum=1, cap=MAX_SEARCH_PAGE)
    return await call.ctx.engine.search(call.world or "", params.get("q"), params.get("chat") or None, limit)


async def export_chat(call: Call) -> Response:
    """GET /api/worlds/{world}/chats/{chat}/export: the chat as a Markdown file (redacted)."""
    _check_searches(call)
    text, filename = await call.ctx.engine.export_chat(call.world or "", call.param("chat"))
    return Response(text, media_type="text/markdown; charset=utf-8", headers={
        "Content-Disposition": f"attachment; filename=\"{filename}\"; filename*=UTF-8''{quote(filename)}",
        "Cache-Control": "no-store"})


def _check_searches(call: Call) -> None:
    """A member's or spectator's searches and exports in a world draw from their own small bucket
    (api/flood.py): each looks through much of the log inside the storage. 429 with `Retry-After` beyond it;
    not the owner's (as for writes, api/http.py)."""
    if call.principal.owner or call.world is None:
        return
    searches = call.ctx.searches
    wait = searches.retry_after(call.world, call.actor.identity)
    if wait:
        call.ctx.metrics.errors.labels("search_flood").inc()
        raise AppError(TOO_MANY, f"too many searches and exports in this world: at most {searches.rate:g} a second "
                                 f"beyond a burst of {searches.burst:g}; try again in {wait} s",
                       status=429, headers={"Retry-After": str(wait)})
